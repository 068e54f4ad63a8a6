"""The callback protocol: what :class:`evolm.loop.ESLoop` calls, and what callbacks may know.

A callback subclasses :class:`Callback` and overrides the hooks it needs; every generation it
gets the typed :class:`~evolm.callbacks.record.GenerationRecord` (``record.as_record()`` is the
flat form written to ``results.jsonl`` and held in ``ctx.history``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from evolm import metrics as M
from evolm.callbacks.record import GenerationRecord, Record
from evolm.es import ESState
from evolm.lora.layout import LoraLayout


@runtime_checkable
class Stateful(Protocol):
    """A task or callback whose state a checkpoint carries (builtins and tensors only)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class RunContext:
    """What callbacks may know about the run.

    ``history`` holds the records of the generations done before this start (a resumed run's,
    from its checkpoint; empty for a fresh run). ``stateful`` names the task and callbacks whose
    ``state_dict()`` a checkpoint carries (``"task"``, ``"callbacks.<name>"``, ``"logger.<name>"``).
    ``tags`` are run-level labels that callbacks set (the health monitor's ``evolm.health``) for
    trackers to record. ``data`` fingerprints the data the run reads, by part (``task``,
    ``extra_evals.<name>``), and ``data_changes`` lists the changes of it that a resume
    accepted (``resume_on_new_data``): checkpoints carry both. ``resumed``: this process
    continues the run (``resume=<run dir>``) and holds its run directory's lock, so no other
    process runs in it.
    """

    output_dir: Path
    generations: int
    layout: LoraLayout
    base_model: str
    config: dict[str, Any] = field(default_factory=dict)
    history: list[Record] = field(default_factory=list)
    stateful: dict[str, Stateful] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)  # set by callbacks; trackers copy them
    resumed: bool = False
    data: dict[str, str] = field(default_factory=dict)
    data_changes: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Sample:
    """One eval prompt (as the model saw it), the mean's completion and its scores;
    ``eval_set``: the extra eval task it comes from (``""``: the task's own eval split)."""

    prompt: str
    completion: str
    scores: dict[str, float]
    eval_set: str = ""


class Callback:
    """Hooks called by :class:`evolm.loop.ESLoop`; override what you need. ``record`` is the
    typed :class:`GenerationRecord` of a generation (generation 0: the start's eval, ``es`` is
    None); ``record.as_record()`` is its flat form, one JSON line: ``generation`` plus
    namespaced metrics (``train/``, ``eval/``, ``es/``, ``time/``; :mod:`evolm.metrics`).

    A resumed run calls ``on_run_start`` with the checkpoint's state and ``ctx.history``; the
    records of those generations are not emitted again. ``on_run_error`` is called instead of
    the rest when the run raises (including KeyboardInterrupt), before the error propagates.
    """

    every_rank: bool = False
    """In a distributed run (:mod:`evolm.dist`) callbacks run on rank 0 alone (they write);
    True runs this one on every rank: one whose decision must be the same everywhere (the
    health monitor's abort), fed with the same records on every rank."""

    def on_run_start(self, ctx: RunContext, state: ESState) -> None: ...

    def on_generation_end(
        self, ctx: RunContext, record: GenerationRecord, state: ESState
    ) -> None: ...

    def on_run_end(self, ctx: RunContext, summary: Record, state: ESState) -> None: ...

    def on_run_error(self, ctx: RunContext, error: BaseException) -> None: ...

    def on_eval(self, ctx: RunContext, generation: int, samples: Sequence[Sample]) -> None:
        """After each evaluation of the mean (before that generation's record is emitted):
        the eval prompts this process generated (all, in one process), in order."""


def latest_eval(history: Sequence[Record]) -> Record:
    """The eval metrics (``eval/*``, ``time/eval_s``) of the last record that has them."""
    for record in reversed(history):
        found = {k: v for k, v in record.items() if M.is_eval(k)}
        if found:
            return found
    return {}
