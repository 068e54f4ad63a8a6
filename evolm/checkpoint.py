"""Checkpoints: everything a run needs to continue exactly where it stopped.

``<run dir>/checkpoints/gen-000012.pt`` (``torch.save``, loadable with ``weights_only=True``)::

    {"format": 1, "generation": 12, "es": ESState.state_dict(), "records": [...],
     "state": {"task": {...}, "logger.mlflow": {"run_id": ...}, ...},
     "run": {"seed": 0, "es.population_size": 30, "lora.rank": 8, ...},
     "data": {"task": "<sha256>", "extra_evals.<name>": "<sha256>"},
     "data_changes": [{"generation": 12, "part": "task", "was": "...", "now": "..."}]}

``records`` are the run's records so far (what ``results.jsonl`` holds); ``state`` holds the
``state_dict()`` of every task and callback that has one (:class:`~evolm.callbacks.Stateful`), under
its name. ``run`` is the config the run's course depends on (:func:`run_identity`): a resumed
run whose config differs from it is refused (:func:`check_identity`), never continued as a mix
of two runs. ``data`` fingerprints the prompts and references the run reads, by part (the
task, each extra eval; :func:`evolm.preflight.agreement.data_fingerprint`): a resume whose
data differs (a data file edited or replaced since) is refused unless asked for
(``resume_on_new_data``), and then ``data_changes`` records each such change. No RNG state is
needed: a generation's population is a pure function of (run seed, generation)
(:meth:`evolm.es.ES.ask`), the training prompts of ``task.train_examples(g)`` and the sampling
seed ``seed + g`` depend only on the generation, and the engines draw from explicit generators
seeded per call. What a task adapts between generations (the scorer's lambda) is task state,
checkpointed here.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from evolm.errors import ConfigError
from evolm.es import ESState

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
    records: list[dict[str, Any]]
    state: dict[str, dict[str, Any]]
    run: dict[str, Any] = field(default_factory=dict)  # run_identity(); empty in old files
    data: dict[str, str] = field(default_factory=dict)  # data fingerprints; empty in old files
    data_changes: list[dict[str, Any]] = field(default_factory=list)


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


def run_identity(config: Mapping[str, Any], keys: Sequence[str] = IDENTITY) -> dict[str, Any]:
    """The resolved config's values under ``keys`` (:data:`IDENTITY`), flattened
    (``es.population_size``), without :data:`NOT_IDENTITY` (an extra eval's task keys count as
    ``task``'s: ``extra_evals.<name>.url`` is left out as ``task.url`` is)."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        elif _as_task_key(prefix) not in NOT_IDENTITY:
            flat[prefix] = list(value) if isinstance(value, list | tuple) else value

    for key in keys:
        if key in config:
            walk(key, config[key])
    return flat


def _as_task_key(key: str) -> str:
    """``extra_evals.<name>.url`` -> ``task.url``; any other key unchanged."""
    parts = key.split(".", 2)
    return f"task.{parts[2]}" if parts[0] == "extra_evals" and len(parts) == 3 else key


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


def data_changes(checkpoint: Checkpoint, data: Mapping[str, str]) -> list[str]:
    """The parts (``task``, ``extra_evals.<name>``) whose data fingerprint in ``data`` differs
    from the one ``checkpoint`` recorded (parts it did not record are not compared: a checkpoint
    from before fingerprints, or an extra eval added since)."""
    return [k for k, v in data.items() if checkpoint.data.get(k, v) != v]


def save_checkpoint(
    directory: Path,
    state: ESState,
    records: list[dict[str, Any]],
    extra: dict[str, dict[str, Any]],
    run: Mapping[str, Any] | None = None,
    data: Mapping[str, str] | None = None,
    changes: list[dict[str, Any]] | None = None,
) -> Path:
    """Write the checkpoint of ``state.generation`` and its digest; returns its path. ``run``
    is the run's :func:`run_identity`, ``data`` its data fingerprints by part and ``changes``
    the data changes a resume accepted."""
    payload = {
        "format": FORMAT,
        "generation": state.generation,
        "es": state.state_dict(),
        "records": records,
        "state": extra,
        "run": dict(run or {}),
        "data": dict(data or {}),
        "data_changes": list(changes or []),
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
        data, changes = dict(d.get("data") or {}), list(d.get("data_changes") or [])
        generation = int(d["generation"])
        return Checkpoint(
            path, generation, d["es"], list(d["records"]), d["state"], run, data, changes
        )
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
