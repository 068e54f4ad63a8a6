"""Model specs: cheap, frozen config objects that name a model and resolve it to a directory.

Constructing a spec loads nothing. ``resolve()`` returns what to pass to ``from_pretrained``: a
hub id or a local directory. A :class:`TinyModel` builds itself (offline, deterministically) into
a cache directory on first use; a :class:`HubModel` names an existing checkpoint.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from evolm.errors import ConfigError
from evolm.files import publish_dir, temp_dir_beside

if TYPE_CHECKING:
    from evolm.model.warmup import WarmupData

logger = logging.getLogger(__name__)

CACHE_ENV = "EVOLM_CACHE_DIR"
DEFAULT_CACHE_DIR = "~/.cache/evolm"
# Bump when the builder's output changes for the same spec: old cache entries are then ignored.
TINY_BUILD_VERSION = 3
MIN_HEAD_DIM = 32  # vLLM's CPU attention rejects smaller heads at the first request.
MIN_VOCAB_SIZE = 512  # 256 byte-level symbols + 3 special tokens + room for merges.


@runtime_checkable
class ModelSpec(Protocol):
    """Anything that names a causal LM: ``resolve()`` gives the path for ``from_pretrained``."""

    def resolve(self) -> str: ...


@dataclass(frozen=True)
class HubModel:
    """A pretrained checkpoint: a hub id (``Qwen/Qwen2.5-0.5B-Instruct``) or a local directory."""

    name_or_path: str
    revision: str | None = None

    def __post_init__(self) -> None:
        if not self.name_or_path:
            raise ConfigError("name_or_path", "is empty", "name a hub id or a local directory")
        if self.revision is not None and self.is_local:
            raise ConfigError(
                "revision",
                f"pins a hub revision, but {self.name_or_path!r} is a local path",
                "remove revision (set it to null) or use a hub id",
            )

    @property
    def is_local(self) -> bool:
        return self.name_or_path.startswith(("/", ".", "~"))

    def resolve(self) -> str:
        """The name or path for ``from_pretrained``.

        A local path must exist. A hub id is returned as is, unless ``revision`` pins one: then
        the snapshot of that revision is fetched (or found in the HF cache) and its directory
        returned, so every loader reads the same files.
        """
        if self.is_local:
            path = Path(self.name_or_path).expanduser()
            if not path.is_dir():
                raise ConfigError(
                    "name_or_path",
                    f"local model directory {str(path)!r} does not exist",
                    "point it at a directory holding config.json, or use a hub id",
                )
            return str(path.resolve())
        if self.revision is None:
            self._fetch(allow_patterns=["config.json"])  # on disk, or reachable: else one error
            return self.name_or_path
        return self._fetch()

    def _fetch(self, allow_patterns: list[str] | None = None) -> str:
        """The hub snapshot's directory, from the HF cache or downloaded; a model that is not
        on disk and cannot be downloaded (offline, no network) is a ConfigError."""
        from huggingface_hub import snapshot_download

        try:
            return snapshot_download(
                self.name_or_path, revision=self.revision, allow_patterns=allow_patterns
            )
        except (OSError, ValueError) as e:  # LocalEntryNotFoundError, HTTP and hub errors
            offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false")
            why = "HF_HUB_OFFLINE is set" if offline else str(e).splitlines()[0][:300]
            raise ConfigError(
                "name_or_path",
                f"hub model {self.name_or_path!r} is not on disk (HF cache) and cannot be "
                f"downloaded ({why})",
                f"download it where there is network (`hf download {self.name_or_path}`, "
                "into the HF cache), or set model.name_or_path=/path/to/a/local/copy"
                + (", or unset HF_HUB_OFFLINE to allow downloads" if offline else ""),
            ) from None


@dataclass(frozen=True)
class TinyModel:
    """A tiny Qwen2-architecture model with a trained byte-level BPE tokenizer.

    Random weights followed by ``warmup_steps`` AdamW steps on built-in question/answer text
    (0 keeps the pure random weights): the result answers verbosely, then stops, which gives the
    conciseness demo something to learn.

    Built offline in a few seconds on first ``resolve()`` and cached under
    ``<cache_dir>/models/tiny-<hash>``; the same fields always give byte-identical files.
    ``vocab_size`` is the embedding size and the BPE target (the built-in corpus reaches it for
    the default 2048; a larger value leaves unused embedding rows, as Qwen's checkpoints do).
    """

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    vocab_size: int = 2048
    max_position_embeddings: int = 1024
    seed: int = 0
    warmup_steps: int = 200
    countdown_share: float = 0.0
    countdown_untagged: float = 0.0
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        for key in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size"):
            if getattr(self, key) < 1:
                raise ConfigError(key, f"must be positive, got {getattr(self, key)}", "set >= 1")
        self._check_heads()
        if self.warmup_steps < 0:
            raise ConfigError(
                "warmup_steps",
                f"must be >= 0, got {self.warmup_steps}",
                "use 0 for pure random weights",
            )
        if not 0.0 <= self.countdown_share <= 1.0:
            raise ConfigError(
                "countdown_share",
                f"must be in [0, 1], got {self.countdown_share}",
                "e.g. 0.5 (half the warm-up steps on countdown), 0 for none",
            )
        if not 0.0 <= self.countdown_untagged < 1.0:
            raise ConfigError(
                "countdown_untagged",
                f"must be in [0, 1), got {self.countdown_untagged}",
                "e.g. 0.5 (half the warm-up answers without <answer> tags), 0 for none",
            )
        if self.vocab_size < MIN_VOCAB_SIZE:
            raise ConfigError(
                "vocab_size", f"{self.vocab_size} is too small", f"set >= {MIN_VOCAB_SIZE}"
            )
        if self.max_position_embeddings < 16:
            raise ConfigError(
                "max_position_embeddings",
                f"{self.max_position_embeddings} is too small",
                "set >= 16",
            )

    def _check_heads(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                "num_heads",
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}",
                "choose num_heads that divides hidden_size",
            )
        head_dim = self.hidden_size // self.num_heads
        if head_dim < MIN_HEAD_DIM:
            raise ConfigError(
                "num_heads",
                f"head_dim = hidden_size / num_heads = {self.hidden_size}/{self.num_heads} "
                f"= {head_dim} < {MIN_HEAD_DIM} (vLLM's CPU attention rejects it)",
                f"lower num_heads or raise hidden_size so that head_dim >= {MIN_HEAD_DIM}",
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                "num_kv_heads",
                f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.num_kv_heads}",
                "choose num_kv_heads that divides num_heads",
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def fingerprint(self, warmup: WarmupData | None = None) -> str:
        """A short hash of everything the build reads: every field that shapes the files (all
        but ``cache_dir``), the built-in corpus and, with ``countdown_share``, the warm-up
        data's :meth:`~evolm.model.warmup.WarmupData.fingerprint` (a changed countdown prompt
        builds a new model instead of reusing a stale one)."""
        fields: dict[str, object] = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self)
        }
        del fields["cache_dir"]
        for key in ("countdown_share", "countdown_untagged"):
            if not fields[key]:  # unused: the same files (and hash) as before the key existed
                del fields[key]
        fields["build_version"] = TINY_BUILD_VERSION
        fields["corpus"] = corpus_digest()
        if self.countdown_share:
            fields["warmup"] = self._warmup(warmup).fingerprint()
        blob = json.dumps(fields, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def _warmup(self, warmup: WarmupData | None) -> WarmupData:
        if warmup is None:
            raise ValueError(
                f"TinyModel(countdown_share={self.countdown_share}) trains on countdown warm-up "
                "data that evolm.model does not own: pass warmup=CountdownWarmup() "
                "(evolm.task.countdown.warmup) to fingerprint/model_dir/resolve, as the "
                "composition root (evolm.app.build.resolve_model) does"
            )
        return warmup

    def cache_root(self) -> Path:
        return cache_root(self.cache_dir)

    def model_dir(self, warmup: WarmupData | None = None) -> Path:
        """Where this spec's model lives (it may not be built yet); ``warmup``: the countdown
        warm-up data, needed when ``countdown_share > 0``."""
        return self.cache_root() / "models" / f"tiny-{self.fingerprint(warmup)}"

    def resolve(self, warmup: WarmupData | None = None) -> str:
        """The model directory, built on first use (atomically; safe across processes);
        ``warmup``: the countdown warm-up data, needed when ``countdown_share > 0``."""
        target = self.model_dir(warmup)
        if not is_built(target):
            logger.info(
                "building the tiny model %s (%d warm-up steps; once: later runs load it)",
                target,
                self.warmup_steps,
            )
            _build_atomically(self, target, warmup=warmup)
        return str(target)


def corpus_digest() -> str:
    """A hash of the built-in corpus the tokenizer and the question/answer warm-up read."""
    from evolm.model.corpus import build_corpus  # pure Python; 0.1 s

    return hashlib.sha256("\n".join(build_corpus(0)).encode()).hexdigest()[:16]


def cache_root(cache_dir: str | None) -> Path:
    """``cache_dir``, else ``$EVOLM_CACHE_DIR``, else ``~/.cache/evolm``."""
    return Path(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR).expanduser()


def _build_tiny(spec: TinyModel, out: Path, warmup: WarmupData | None) -> None:
    from evolm.model.tiny import build_tiny_model  # heavy imports only when building

    build_tiny_model(out, spec, warmup)


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


def _build_atomically(
    spec: TinyModel | None,
    target: Path,
    build: Callable[[Path], object] | None = None,
    warmup: WarmupData | None = None,
) -> None:
    """Build into a temp dir beside ``target`` with ``build(tmp)`` (None: the tiny model of
    ``spec``), then rename, its files readable as the umask says (:mod:`evolm.files`); if
    another process won, keep theirs. An unusable ``target`` (:func:`model_problem`: a truncated
    copy, weights missing) is replaced, with a warning. A cache folder that cannot be written
    is a ConfigError naming ``cache_dir`` and ``$EVOLM_CACHE_DIR``."""
    problem = model_problem(target) if target.exists() else None
    if problem is not None:
        logger.warning("the cached model %s is unusable (%s): building it again", target, problem)
    try:
        with temp_dir_beside(target) as tmp:
            if build is None:
                assert spec is not None
                _build_tiny(spec, tmp, warmup)
            else:
                build(tmp)
            if publish_dir(tmp, target, replace=False):
                logger.info("built %s", target)
            elif (problem := model_problem(target)) is None:
                logger.info("another process built %s first; keeping theirs", target)
            else:
                publish_dir(tmp, target, replace=True)
                logger.info("built %s (replacing the unusable one: %s)", target, problem)
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC):
            raise
        raise ConfigError(
            "cache_dir",
            f"cannot write the model cache {target.parent} to build {target.name} ({e.strerror})",
            f"point model.cache_dir (or ${CACHE_ENV}) at a folder you can write, or build the "
            "model there once as a user who can",
        ) from None
