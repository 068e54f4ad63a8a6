"""Checkpoints: everything a run needs to continue exactly where it stopped.

``<run dir>/checkpoints/gen-000012.pt`` (``torch.save``, loadable with ``weights_only=True``)::

    {"format": 1, "generation": 12, "es": ESState.state_dict(), "records": [...],
     "state": {"task": {...}, "logger.mlflow": {"run_id": ...}, ...},
     "run": {"seed": 0, "es.population_size": 30, "lora.rank": 8, ...}}

``records`` are the run's records so far (what ``results.jsonl`` holds); ``state`` holds the
``state_dict()`` of every task and callback that has one (:class:`~evolm.loop.Stateful`), under
its name. ``run`` is the config the run's course depends on (:func:`run_identity`): a resumed
run whose config differs from it is refused (:func:`check_identity`), never continued as a mix
of two runs. No RNG state is needed: a generation's population is a pure function of (run seed,
generation) (:meth:`evolm.es.ES.ask`), the training prompts of ``task.train_examples(g)`` and the
sampling seed ``seed + g`` depend only on the generation, and the engines draw from explicit
generators seeded per call. What a task adapts between generations (the scorer's lambda) is
task state, checkpointed here.

Writes are atomic and durable (temp file, fsync, ``os.replace``, fsync of the folder). Beside
each checkpoint, ``gen-000012.pt.sha256`` holds its SHA-256, written last: a checkpoint without
it, with another digest (truncated or corrupt) or that ``torch.load`` rejects is skipped with a
warning and the previous one is used.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from evolm.errors import ConfigError, RunAborted
from evolm.es import ESState
from evolm.interrupt import interruption
from evolm.loop import Callback, Record, RunContext

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
FORMAT = 1
_NAME = re.compile(r"^gen-(\d+)\.pt$")
# The config a run's course depends on (what is generated, scored and how the mean moves) ...
IDENTITY = ("seed", "es", "lora", "model", "task")
# ... but where things are and how they are reached, which may change between processes.
NOT_IDENTITY = {"model.cache_dir", "task.url", "task.timeout_s", "task.retries", "task.backoff_s"}


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be used (truncated, corrupt, unfinished)."""


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint (see the module docstring for the fields)."""

    path: Path
    generation: int
    es: dict[str, Any]
    records: list[Record]
    state: dict[str, dict[str, Any]]
    run: dict[str, Any] = field(default_factory=dict)  # run_identity(); empty in old files


def checkpoint_path(directory: Path, generation: int) -> Path:
    return directory / f"gen-{generation:06d}.pt"


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename, fsync of the folder."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # disk full, interrupted: leave no partial file behind
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run_identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved config's :data:`IDENTITY` values, flattened (``es.population_size``),
    without :data:`NOT_IDENTITY`."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        elif prefix not in NOT_IDENTITY:
            flat[prefix] = list(value) if isinstance(value, list | tuple) else value

    for key in IDENTITY:
        if key in config:
            walk(key, config[key])
    return flat


def check_identity(checkpoint: Checkpoint, identity: Mapping[str, Any]) -> None:
    """The checkpoint was written by a run configured as ``identity`` (:func:`run_identity` of
    the config being resumed); else a ConfigError naming the values that differ. A checkpoint
    from before ``run`` was recorded is checked on the seed of its ES state only."""
    recorded = dict(checkpoint.run)
    recorded["seed"] = checkpoint.es.get("seed")  # what its noise is drawn from
    keys = sorted(recorded.keys() | identity.keys()) if checkpoint.run else ["seed"]
    unset = "<unset>"
    differ = [k for k in keys if recorded.get(k, unset) != identity.get(k, unset)]
    if not differ:
        return
    shown = ", ".join(
        f"{k}={recorded.get(k, unset)!r} (config.yaml: {identity.get(k, unset)!r})"
        for k in differ[:6]
    )
    more = f" and {len(differ) - 6} more" if len(differ) > 6 else ""
    raise ConfigError(
        "resume",
        f"checkpoint {checkpoint.path} was written by a run with {shown}{more}: continuing it "
        "with this run's config would mix two runs",
        "restore those values in the run's config.yaml, move that checkpoint away, or start a "
        "new run (without resume=) with the new values",
    )


def save_checkpoint(
    directory: Path,
    state: ESState,
    records: list[Record],
    extra: dict[str, dict[str, Any]],
    run: Mapping[str, Any] | None = None,
) -> Path:
    """Write the checkpoint of ``state.generation`` and its digest; returns its path. ``run``
    is the run's :func:`run_identity`."""
    payload = {
        "format": FORMAT,
        "generation": state.generation,
        "es": state.state_dict(),
        "records": records,
        "state": extra,
        "run": dict(run or {}),
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()
    directory.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(directory, state.generation)
    digest = f"{hashlib.sha256(data).hexdigest()}  {path.name}\n"
    try:
        atomic_write(path, data)
        atomic_write(_digest_path(path), digest.encode())
    except OSError:
        path.unlink(missing_ok=True)  # without its digest it is unusable anyway
        raise
    return path


def load_checkpoint(path: Path) -> Checkpoint:
    """Read and verify one checkpoint; raises :class:`CheckpointError` if it is unusable."""
    digest = _digest_path(path)
    if not digest.is_file():
        raise CheckpointError(f"{digest.name} is missing (the write was interrupted)")
    data = path.read_bytes()
    expected = digest.read_text().split()[:1]
    if [hashlib.sha256(data).hexdigest()] != expected:
        raise CheckpointError(f"its SHA-256 differs from {digest.name} (truncated or corrupt)")
    try:
        d = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        if d["format"] != FORMAT:
            raise CheckpointError(f"format {d['format']}, this evolm reads {FORMAT}")
        run = dict(d.get("run") or {})
        return Checkpoint(path, int(d["generation"]), d["es"], list(d["records"]), d["state"], run)
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"torch.load failed: {e}") from e


def check_shapes(checkpoint: Checkpoint, shapes: list[tuple[int, ...]]) -> None:
    """The checkpoint's ES mean has the run's LoRA shapes (else: a checkpoint of another rank
    or model was put into this run): a ConfigError naming the file."""
    have = [tuple(t.shape) for t in checkpoint.es["mean"]]
    if have != [tuple(s) for s in shapes]:
        raise ConfigError(
            "resume",
            f"checkpoint {checkpoint.path} does not fit this run: it holds {len(have)} LoRA "
            f"tensors of shapes {have[:2]}..., this run's config gives {len(shapes)} of shapes "
            f"{list(shapes[:2])}... (another lora.rank, lora targets or model)",
            "resume with the checkpoints this run wrote, or move this file away",
        )


def checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """``(generation, path)`` of the checkpoint files in ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    found = [(_NAME.match(p.name), p) for p in directory.iterdir()]
    return sorted((int(m.group(1)), p) for m, p in found if m)


def latest_checkpoint(directory: Path) -> Checkpoint | None:
    """The newest usable checkpoint in ``directory`` (None if there is none); every newer,
    unusable one is reported with a warning."""
    for _, path in reversed(checkpoints(directory)):
        try:
            return load_checkpoint(path)
        except CheckpointError as e:
            log.warning("checkpoint %s is unusable: %s; trying the previous one", path, e)
    return None


def prune(directory: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints (with their digests)."""
    for _, path in checkpoints(directory)[:-keep]:
        _digest_path(path).unlink(missing_ok=True)
        path.unlink(missing_ok=True)


class Checkpointer(Callback):
    """Saves a checkpoint every ``every`` generations and at the last one, keeping the newest
    ``keep``, in ``<run dir>/checkpoints/``. Resume with ``python -m evolm resume=<run dir>``.

    A run stopped by SIGINT or SIGTERM (:mod:`evolm.interrupt`) also saves its last finished
    generation, so its resume loses no finished work."""

    def __init__(self, every: int = 10, keep: int = 2) -> None:
        if every < 1:
            raise ConfigError("every", f"must be >= 1, got {every}", "e.g. every=10")
        if keep < 1:
            raise ConfigError("keep", f"must be >= 1, got {keep}", "e.g. keep=2")
        self.every = every
        self.keep = keep
        self.records: list[Record] = []
        # the newest finished generation not yet saved: its state, the task and callback state
        # and how many records it has
        self.unsaved: tuple[ESState, dict[str, dict[str, Any]], int] | None = None

    def on_run_start(self, ctx: RunContext, state: ESState) -> None:
        self.records, self.unsaved = list(ctx.history), None

    def on_generation_end(self, ctx: RunContext, record: Record, state: ESState) -> None:
        self.records.append(record)
        g = state.generation
        if g == 0:
            return
        extra = {name: obj.state_dict() for name, obj in ctx.stateful.items()}
        self.unsaved = (state, extra, len(self.records))
        if g % self.every == 0 or g == ctx.generations:
            self.save(ctx, state, extra, len(self.records))

    def on_run_error(self, ctx: RunContext, error: BaseException) -> None:
        stop = interruption(error)
        if stop is None or self.unsaved is None:
            return
        state, extra, count = self.unsaved
        if state.consumed:  # es.mean=full updated its mean in place since: not that generation's
            log.warning(
                "%s: generation %d's mean was already being updated in place (es.mean=full); "
                "the last checkpoint is kept",
                stop.name,
                state.generation,
            )
            return
        try:
            path = self.save(ctx, state, extra, count)
        except RunAborted as e:  # the disk is full: the interruption stays the error
            log.error("%s", e)
            return
        log.info("%s: saved generation %d (%s)", stop.name, state.generation, path)

    def save(
        self, ctx: RunContext, state: ESState, extra: dict[str, dict[str, Any]], count: int
    ) -> Path:
        """Checkpoint ``state`` with ``extra`` and the first ``count`` records."""
        g = state.generation
        directory = Path(ctx.output_dir) / CHECKPOINT_DIR
        try:
            run = run_identity(ctx.config)
            path = save_checkpoint(directory, state, self.records[:count], extra, run)
        except OSError as e:  # e.g. ENOSPC: the partial files are removed
            found = checkpoints(directory)
            last = f"the last good one, {found[-1][1]}, is kept" if found else "none exists"
            raise RunAborted(
                f"could not write the checkpoint of generation {g} in {directory} ({e}); "
                f"its partial file was removed and {last}. Fix: free disk space, then "
                f"python -m evolm resume={ctx.output_dir}"
            ) from e
        self.unsaved = None
        prune(directory, self.keep)
        log.debug("checkpoint %s", path)
        return path
