"""The best trial of a sweep so far (or, with several objectives, its Pareto front), from the
Optuna study and the trial that just ended."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from omegaconf import DictConfig
from optuna.trial import FrozenTrial, TrialState

from evolm.sweep.parent_run import Best
from evolm.tracking.store import sqlite_lock

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Finished:
    """A trial that ended in this process: its sampled params and value (None: failed)."""

    params: dict[str, Any]
    value: float | tuple[float, ...] | None  # a tuple: one value per objective


def directions(sweeper: DictConfig) -> list[str]:
    """``maximize`` / ``minimize`` per objective (a string, a list, or Direction enums)."""
    direction = sweeper.direction
    listed = (
        direction
        if not isinstance(direction, str) and isinstance(direction, Sequence)
        else [direction]
    )
    return ["maximize" if str(d).endswith("maximize") else "minimize" for d in listed]


def maximizing(sweeper: DictConfig) -> bool:
    """The (first) direction is maximize."""
    return directions(sweeper)[0] == "maximize"


def load_study(sweeper: DictConfig) -> optuna.Study | None:
    """The sweep's study (None: in-memory storage, only the sweeping process knows it)."""
    if sweeper.storage is None:
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=sweeper.study_name, storage=sweeper.storage)


def resume_seed(seed: int, trials: int, worker: int = 0) -> int:
    """The sampler seed of worker ``worker`` of a sweep whose study holds ``trials`` trials:
    ``seed`` itself for worker 0 of a new study, else an independent 32-bit seed drawn from
    ``(seed, trials, worker)``. Optuna's seeded samplers restart their random stream in every
    process, so a resumed study (or a second worker) would otherwise repeat the first trials'
    parameters exactly."""
    if trials == 0 and worker == 0:
        return seed
    return int(np.random.SeedSequence([seed, trials, worker]).generate_state(1)[0])


def sweep_seed(seed: int, worker: int = 0) -> int:
    """The ``${evolm_sweep_seed:SEED,WORKER}`` resolver, for ``hydra.sweeper.sampler.seed``:
    :func:`resume_seed` of the sweep being started (its study is read from Hydra's config).
    An interpolation, not a value written into the config, because Hydra checks that every
    trial's ``hydra.sweeper`` node equals the sweep's."""
    from hydra.core.hydra_config import HydraConfig

    trials = count_trials(HydraConfig.get().sweeper) if HydraConfig.initialized() else 0
    new = resume_seed(int(seed), trials, int(worker))
    if new != seed:
        log.info("sampler seed %s -> %d (worker %s, study of %d trials)", seed, new, worker, trials)
    return new


def existing_study(sweeper: DictConfig) -> optuna.Study | None:
    """The sweep's study if its storage holds it (None: in memory, unnamed, or not created
    yet). A fresh sqlite store's tables are created here under :func:`sqlite_lock`: two sweep
    workers started at once would otherwise both create them and one would fail."""
    storage, name = sweeper.get("storage"), sweeper.get("study_name")
    if storage is None or name is None:
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with sqlite_lock(storage):
        if name not in optuna.get_all_study_names(storage=storage):
            return None
    return optuna.load_study(study_name=name, storage=storage)


def count_trials(sweeper: DictConfig) -> int:
    """Trials already in the sweep's study (0: none yet, or in-memory storage)."""
    study = existing_study(sweeper)
    return 0 if study is None else len(study.get_trials(deepcopy=False))


def study_counts(sweeper: DictConfig) -> tuple[int, int]:
    """``(complete, failed)`` trials of the sweep's study (``(0, 0)`` in memory or missing)."""
    study = existing_study(sweeper)
    trials = [] if study is None else study.get_trials(deepcopy=False)
    complete = sum(t.state is TrialState.COMPLETE for t in trials)
    return complete, sum(t.state is TrialState.FAIL for t in trials)


def summarize(
    sweeper: DictConfig, own: Sequence[Finished], pending: Finished | None
) -> tuple[Best | None, int, int]:
    """``(best, complete, failed)`` over the study's told trials plus ``pending`` (the trial
    that just ended, not told yet); over ``own`` when the study is in memory."""
    candidates, complete, failed = completed(sweeper, own, pending)
    return _pick(candidates, maximizing(sweeper)), complete, failed


def front(
    sweeper: DictConfig, own: Sequence[Finished], pending: Finished | None
) -> tuple[list[Best], int, int]:
    """``(Pareto front, complete, failed)`` of a multi-objective sweep, as :func:`summarize`."""
    candidates, complete, failed = completed(sweeper, own, pending)
    return pareto(candidates, directions(sweeper)), complete, failed


def pareto(points: Sequence[Best], directions: Sequence[str]) -> list[Best]:
    """The points no other point dominates (as good in every objective, better in one),
    ordered by their first objective, best first."""
    signs = [1.0 if d == "maximize" else -1.0 for d in directions]

    def score(b: Best) -> tuple[float, ...]:
        values = b.value if isinstance(b.value, tuple) else (b.value,)
        return tuple(s * v for s, v in zip(signs, values, strict=True))

    def dominated(p: Best) -> bool:
        mine = score(p)
        return any(
            all(o >= m for o, m in zip(other, mine, strict=True)) and other != mine
            for other in map(score, points)
        )

    return sorted((p for p in points if not dominated(p)), key=score, reverse=True)


def completed(
    sweeper: DictConfig, own: Sequence[Finished], pending: Finished | None
) -> tuple[list[Best], int, int]:
    """``(completed trials, complete, failed)``: the study's told trials plus ``pending``, or
    ``own`` when the study is in memory."""
    study = load_study(sweeper)
    if study is None:
        candidates = [Best(None, f.value, f.params) for f in own if f.value is not None]
        failed = sum(f.value is None for f in own)
        return candidates, len(own) - failed, failed
    trials = study.get_trials(deepcopy=False)
    candidates = [_best(t) for t in trials if t.state is TrialState.COMPLETE]
    complete, failed = len(candidates), sum(t.state is TrialState.FAIL for t in trials)
    if pending is not None:
        if pending.value is None:
            failed += 1
        else:
            complete += 1
            running = [t for t in trials if t.state is TrialState.RUNNING]
            number = next((t.number for t in running if t.params == pending.params), None)
            candidates.append(Best(number, pending.value, pending.params))
    return candidates, complete, failed


def _best(trial: FrozenTrial) -> Best:
    assert trial.values is not None
    values = tuple(trial.values)
    return Best(trial.number, values[0] if len(values) == 1 else values, dict(trial.params))


def _pick(candidates: list[Best], maximize: bool) -> Best | None:
    if not candidates:
        return None
    return (max if maximize else min)(candidates, key=lambda b: b.value)
