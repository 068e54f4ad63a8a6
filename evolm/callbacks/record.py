"""The typed record of one generation, the one thing every callback gets after it.

:meth:`GenerationRecord.as_record` flattens it into one JSON line (the names are
:mod:`evolm.metrics`'): what ``results.jsonl`` holds, MLflow logs as one step, and a resumed
run's ``ctx.history`` lists.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from evolm import metrics as M
from evolm.es import TellStats

Record = dict[str, Any]
"""A flat record: ``generation`` plus namespaced metrics (one line of ``results.jsonl``)."""


@dataclass(frozen=True)
class GenerationRecord:
    """One generation, typed: what ``ES.tell`` reported, the task's scores, the timings and,
    when the mean was evaluated after it, the eval metrics.

    Generation 0 is the start: the mean's first evaluation (``eval``) and the task's data
    statistics (``data``), no ES step (``es`` is None, the step fields keep their defaults).
    """

    generation: int
    es: TellStats | None = None  # None: generation 0 (no ES step yet)
    scores: Mapping[str, float] = field(default_factory=dict)  # mean task scores, all members
    # the unperturbed mean's scores on the same training rows (train_mean=true; else empty)
    mean_scores: Mapping[str, float] = field(default_factory=dict)
    member_gap_se: float | None = None  # the standard error of the mean's reward minus theirs
    task_stats: Mapping[str, float] = field(default_factory=dict)  # Task.after_generation's
    generate_s: float = 0.0
    score_s: float = 0.0
    es_s: float = 0.0
    generation_s: float = 0.0
    train_s: float | None = None  # the run's training time so far (the loop's TrainClock)
    engine_timings: Mapping[str, float] = field(default_factory=dict)
    comm_s: float | None = None  # distributed runs: all-gather + mean check (None: one process)
    diagnostics: Mapping[str, float] = field(default_factory=dict)  # evolm.diagnostics
    weight_change: Mapping[str, float] = field(default_factory=dict)  # es/update_rel, mean_rel
    eval: Mapping[str, float] = field(default_factory=dict)  # eval/*, time/eval_s (flat names)
    data: Mapping[str, float] = field(default_factory=dict)  # data/* (generation 0; flat names)

    @property
    def mean_reward(self) -> float | None:
        """The unperturbed mean's reward on the generation's training rows
        (``train/mean/reward``), None when it was not scored (``train_mean=false``)."""
        return self.mean_scores.get("reward")

    def mean_metrics(self) -> dict[str, float]:
        """``train/mean/<score>`` of every score of the mean, ``train/member_gap`` (the
        mean's reward minus the members' average reward) and its standard error; empty without
        ``mean_scores``."""
        out = {M.train_mean_score(k): v for k, v in self.mean_scores.items()}
        if "reward" in self.mean_scores and "reward" in self.scores:
            out[M.MEMBER_GAP] = self.mean_scores["reward"] - self.scores["reward"]
        if self.member_gap_se is not None:
            out[M.MEMBER_GAP_SE] = self.member_gap_se
        return out

    @property
    def eval_reward(self) -> float | None:
        """The mean's eval reward (``eval/reward_mean``), None when not evaluated here."""
        return self.eval.get(M.EVAL_REWARD)

    def as_record(self) -> Record:
        """The flat record (:mod:`evolm.metrics` names), as ``results.jsonl`` holds it."""
        if self.es is None:
            return {M.GENERATION: self.generation, **self.eval, **self.data}
        es = self.es
        return {
            M.GENERATION: self.generation,
            M.FITNESS_MEAN: es.fitness_mean,
            M.FITNESS_STD: es.fitness_std,
            M.FITNESS_MIN: es.fitness_min,
            M.FITNESS_MAX: es.fitness_max,
            M.FITNESS_P20: es.fitness_p20,
            M.FITNESS_P80: es.fitness_p80,
            M.FITNESS_NONFINITE: es.fitness_nonfinite,
            # a member's fitness is its mean reward: train/reward_mean would repeat fitness_mean
            **{M.train_score(k): v for k, v in self.scores.items() if k != "reward"},
            **self.mean_metrics(),
            **{M.task_stat(k): v for k, v in self.task_stats.items()},
            **{M.train_diagnostic(k): v for k, v in self.diagnostics.items()},
            M.UPDATE_NORM: es.update_norm,
            M.MEAN_NORM: es.mean_norm,
            **self.weight_change,
            M.GENERATE_S: self.generate_s,
            M.SCORE_S: self.score_s,
            **{M.engine_time(k): v for k, v in self.engine_timings.items()},
            M.ES_S: self.es_s,
            M.GENERATION_S: self.generation_s,
            **({} if self.train_s is None else {M.TRAIN_S: self.train_s}),
            **({} if self.comm_s is None else {M.COMM_S: self.comm_s}),
            **self.eval,
        }
