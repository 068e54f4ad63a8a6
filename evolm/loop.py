"""The ES loop: ask -> build member adapters -> evaluate all at once -> shape -> tell.

Reads no config and writes no files: everything observable goes through callbacks
(:class:`Callback`), so logging and checkpointing plug in without touching the loop.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from evolm.engine.base import Engine
from evolm.es import ES, ESState
from evolm.evaluate import evaluate
from evolm.lora.layout import LoraLayout, LoraPopulation
from evolm.task.base import Task

log = logging.getLogger(__name__)

Record = dict[str, Any]


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
    """

    output_dir: Path
    generations: int
    layout: LoraLayout
    base_model: str
    config: dict[str, Any] = field(default_factory=dict)
    history: list[Record] = field(default_factory=list)
    stateful: dict[str, Stateful] = field(default_factory=dict)


class Callback:
    """Hooks called by :class:`ESLoop`; override what you need. ``record`` is one JSON line:
    ``generation`` plus namespaced metrics (``train/``, ``eval/``, ``es/``, ``time/``).

    A resumed run calls ``on_run_start`` with the checkpoint's state and ``ctx.history``; the
    records of those generations are not emitted again. ``on_run_error`` is called instead of
    the rest when the run raises (including KeyboardInterrupt), before the error propagates.
    """

    def on_run_start(self, ctx: RunContext, state: ESState) -> None: ...

    def on_generation_end(self, ctx: RunContext, record: Record, state: ESState) -> None: ...

    def on_run_end(self, ctx: RunContext, summary: Record, state: ESState) -> None: ...

    def on_run_error(self, ctx: RunContext, error: BaseException) -> None: ...


def latest_eval(history: Sequence[Record]) -> Record:
    """The eval metrics (``eval/*``, ``time/eval_s``) of the last record that has them."""
    for record in reversed(history):
        found = {k: v for k, v in record.items() if k.startswith("eval/") or k == "time/eval_s"}
        if found:
            return found
    return {}


def percentile(x: torch.Tensor, q: float) -> float:
    finite = x[torch.isfinite(x)]
    return torch.quantile(finite, q).item() if len(finite) else math.nan


@dataclass
class ESLoop:
    """Runs ``generations`` ES updates from ``state``; evaluates the mean on the eval split at
    the start, every ``eval_every`` generations and at the end."""

    strategy: ES
    task: Task
    engine: Engine
    layout: LoraLayout
    generations: int
    eval_every: int
    seed: int
    callbacks: Sequence[Callback] = ()

    def evaluate_mean(self, state: ESState) -> Record:
        start = time.perf_counter()
        mean = LoraPopulation.single(self.layout, state.mean)
        ev = evaluate(self.engine, self.task, self.task.eval_examples(), mean, self.seed)
        metrics = {f"eval/{k}_mean": v for k, v in ev.metrics.items()}
        return {**metrics, "time/eval_s": time.perf_counter() - start}

    def step(self, state: ESState) -> tuple[ESState, Record]:
        """One generation: returns the new state and its record (without eval metrics)."""
        start = time.perf_counter()
        generation = state.generation + 1
        pop = self.strategy.ask(state)
        adapters = LoraPopulation(self.layout, tuple(self.strategy.sample(state, pop)))
        sampled = time.perf_counter()
        examples = self.task.train_examples(generation)
        ev = evaluate(self.engine, self.task, examples, adapters, seed=self.seed + generation)
        told = time.perf_counter()
        state, stats = self.strategy.tell(state, pop, ev.fitness)
        task_stats = (
            self.task.after_generation(ev) if hasattr(self.task, "after_generation") else {}
        )
        f = ev.fitness
        record: Record = {
            "generation": generation,
            "train/fitness_mean": f.nanmean().item(),
            "train/fitness_p20": percentile(f, 0.2),
            "train/fitness_p80": percentile(f, 0.8),
            "train/fitness_max": f.nan_to_num(-math.inf).max().item(),
            **{f"train/{k}_mean": v for k, v in ev.metrics.items()},
            **{f"train/{k}": v for k, v in task_stats.items()},
            "es/update_norm": stats["update_norm"],
            "time/generate_s": ev.generate_s,
            "time/score_s": ev.score_s,
            # the engine's own phases (prefill/decode; servers: adapter write/load/unload)
            **{f"time/engine_{k}": v for k, v in getattr(self.engine, "last_timings", {}).items()},
            "time/es_s": (sampled - start) + (time.perf_counter() - told),
        }
        record["time/generation_s"] = time.perf_counter() - start
        return state, record

    def run(self, state: ESState, ctx: RunContext) -> tuple[ESState, Record]:
        """Run from ``state.generation`` to ``self.generations``; returns the final state and
        the summary (the last eval). A resumed run (``state.generation > 0``, records so far in
        ``ctx.history``) does not evaluate the start again."""
        for cb in self.callbacks:
            cb.on_run_start(ctx, state)
        try:
            state, summary = self._generations(state, ctx)
            for cb in self.callbacks:
                cb.on_run_end(ctx, summary, state)
        except BaseException as error:
            for cb in self.callbacks:
                cb.on_run_error(ctx, error)
            raise
        return state, summary

    def _generations(self, state: ESState, ctx: RunContext) -> tuple[ESState, Record]:
        last_eval = latest_eval(ctx.history)
        if state.generation == 0:
            last_eval = self.evaluate_mean(state)
            self._emit(ctx, {"generation": 0, **last_eval}, state)
        while state.generation < self.generations:
            state, record = self.step(state)
            g = state.generation
            if g % self.eval_every == 0 or g == self.generations:
                last_eval = self.evaluate_mean(state)
                record.update(last_eval)
            self._emit(ctx, record, state)
        return state, {"generation": state.generation, **last_eval}

    def _emit(self, ctx: RunContext, record: Record, state: ESState) -> None:
        for cb in self.callbacks:
            cb.on_generation_end(ctx, record, state)
