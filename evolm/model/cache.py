"""The model cache: where built and converted models live, and how one is built into it.

A model that builds itself (:class:`~evolm.model.tiny.TinyModel`, offline) or is converted once
(:class:`~evolm.model.gguf.GGUFModel`) lives under ``<cache>/models/<name>-<hash>``: built in a
folder beside it and renamed into place (:mod:`evolm.files`), safe across processes, and used
only once it loads (:func:`is_built`). One process builds a model at a time: another that asks for
it meanwhile waits for that build and loads its result (``<cache>/locks/<name>.lock``), instead
of building it a second time beside it.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import Timeout

from evolm.errors import ConfigError
from evolm.files import file_lock, publish_dir, temp_dir_beside

logger = logging.getLogger(__name__)

CACHE_ENV = "EVOLM_CACHE_DIR"
DEFAULT_CACHE_DIR = "~/.cache/evolm"


def cache_root(cache_dir: str | None) -> Path:
    """``cache_dir``, else ``$EVOLM_CACHE_DIR``, else ``~/.cache/evolm``."""
    return Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR).expanduser()


def model_problem(model_dir: Path) -> str | None:
    """Why the built model in ``model_dir`` cannot load, or None when it can. Cheap (no hash):
    ``config.json`` parses, and every safetensors file of the weights (``model.safetensors``, or
    the shards ``model.safetensors.index.json`` names) is there and opens: its header parses and
    its tensors' byte ranges cover the file exactly (a truncated or cut copy fails)."""
    from safetensors import safe_open  # only when a cached model is checked

    try:
        json.loads((model_dir / "config.json").read_text())
        index = model_dir / "model.safetensors.index.json"
        files = ["model.safetensors"]
        if index.is_file():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its config or weight index is unreadable ({str(e).splitlines()[0][:200]})"
    for name in files:
        if not (model_dir / name).is_file():
            return f"{name} is missing"
        try:
            with safe_open(str(model_dir / name), framework="numpy"):
                pass
        except Exception as e:  # SafetensorError (truncated, corrupt header), OSError
            return f"{name} is unreadable ({str(e).splitlines()[0][:200]})"
    return None


def is_built(model_dir: Path) -> bool:
    """A model directory that exists and loads (:func:`model_problem`)."""
    return model_dir.is_dir() and model_problem(model_dir) is None


def build_lock(target: Path) -> Path:
    """The lock file a build of ``target`` (``<cache>/models/<name>``) holds:
    ``<cache>/locks/<name>.lock``, outside the models folder, which holds only models."""
    return target.parent.parent / "locks" / f"{target.name}.lock"


def build_atomically(target: Path, build: Callable[[Path], object]) -> None:
    """Build into a temp dir beside ``target`` with ``build(tmp)``, then rename, its files
    readable as the umask says (:mod:`evolm.files`). Under :func:`build_lock`: a process that
    finds another building ``target`` waits for it (a log line says so), then uses its model
    instead of building one more; on a filesystem that takes no locks (:data:`NO_LOCKS`) it
    builds unlocked, and where two built so, the first rename wins. An unusable ``target``
    (:func:`model_problem`: a truncated copy, weights missing) is replaced, with a warning. A
    cache folder that cannot be written is a ConfigError naming ``cache_dir`` and
    ``$EVOLM_CACHE_DIR``."""
    try:
        with _locked(target):
            if is_built(target):  # built by the process this one waited for
                logger.info("another process built %s; using it", target)
                return
            _build_unlocked(target, build)
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC):
            raise
        raise ConfigError(
            "cache_dir",
            f"cannot write the model cache {target.parent} to build {target.name} ({e.strerror})",
            f"point model.cache_dir (or ${CACHE_ENV}) at a folder you can write, or build the "
            "model there once as a user who can",
        ) from None


NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP}
"""What ``flock`` fails with on a filesystem that takes no locks (some network mounts). Where
``flock`` is missing (ENOSYS), filelock 3.25.2+ falls back to a lock file of its own; older
releases raise NotImplementedError, taken as no lock too."""


@contextmanager
def _locked(target: Path) -> Iterator[None]:
    """Hold :func:`build_lock` of ``target``, waiting for a process that holds it; where the
    filesystem takes no locks, go on without one (a log line says so)."""
    lock = file_lock(build_lock(target))
    held = True
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:
            logger.info("another process is building %s: waiting for it", target)
            lock.acquire()
    except (OSError, NotImplementedError) as e:
        if isinstance(e, OSError) and e.errno not in NO_LOCKS:
            raise
        why = e.strerror if isinstance(e, OSError) else str(e)
        logger.info("the model cache takes no locks (%s): building %s unlocked", why, target)
        held = False
    try:
        yield
    finally:
        if held:
            lock.release()


def _build_unlocked(target: Path, build: Callable[[Path], object]) -> None:
    problem = model_problem(target) if target.exists() else None
    if problem is not None:
        logger.warning("the cached model %s is unusable (%s): building it again", target, problem)
    with temp_dir_beside(target) as tmp:
        build(tmp)
        if publish_dir(tmp, target, replace=False):
            logger.info("built %s", target)
        elif (problem := model_problem(target)) is None:
            logger.info("another process built %s first; keeping theirs", target)
        else:
            publish_dir(tmp, target, replace=True)
            logger.info("built %s (replacing the unusable one: %s)", target, problem)
