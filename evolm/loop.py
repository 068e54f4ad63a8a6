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
from typing import Any

import torch

from evolm.es import ES, ESState
from evolm.evaluate import evaluate
from evolm.lora.layout import LoraLayout, LoraPopulation
from evolm.server.base import Engine
from evolm.task.base import Task

log = logging.getLogger(__name__)

Record = dict[str, Any]


@dataclass
class RunContext:
    """What callbacks may know about the run."""

    output_dir: Path
    generations: int
    layout: LoraLayout
    base_model: str
    config: dict[str, Any] = field(default_factory=dict)


class Callback:
    """Hooks called by :class:`ESLoop`; override what you need. ``record`` is one JSON line:
    ``generation`` plus namespaced metrics (``train/``, ``eval/``, ``es/``, ``time/``)."""

    def on_run_start(self, ctx: RunContext, state: ESState) -> None: ...

    def on_generation_end(self, ctx: RunContext, record: Record, state: ESState) -> None: ...

    def on_run_end(self, ctx: RunContext, summary: Record, state: ESState) -> None: ...


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
            "time/es_s": (sampled - start) + (time.perf_counter() - told),
        }
        record["time/generation_s"] = time.perf_counter() - start
        return state, record

    def run(self, state: ESState, ctx: RunContext) -> tuple[ESState, Record]:
        """Run to ``self.generations``; returns the final state and the summary (last eval)."""
        for cb in self.callbacks:
            cb.on_run_start(ctx, state)
        last_eval: Record = {}
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
        summary = {"generation": state.generation, **last_eval}
        for cb in self.callbacks:
            cb.on_run_end(ctx, summary, state)
        return state, summary

    def _emit(self, ctx: RunContext, record: Record, state: ESState) -> None:
        for cb in self.callbacks:
            cb.on_generation_end(ctx, record, state)
