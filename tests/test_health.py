"""A run that cannot learn says so: the health monitor's warning, MLflow tag and abort."""

from __future__ import annotations

import logging
from pathlib import Path

import mlflow
import pytest

from evolm.errors import RunAborted
from evolm.loop import RunContext
from evolm.lora import LoraLayout
from evolm.tracking.health import TAG, LearningMonitor
from tests.helpers import read_results, run_cli


def record(generation: int, std: float, update: float = 0.1, mean: float = -4.0) -> dict:
    return {
        "generation": generation,
        "train/fitness_mean": mean,
        "train/fitness_std": std,
        "es/update_norm": update,
    }


def context(tmp_path: Path) -> RunContext:
    return RunContext(tmp_path, 10, LoraLayout((), 1, 1.0, 1), "m")


def test_ties_are_reported_once_after_patience(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monitor, ctx = LearningMonitor(patience=2), context(tmp_path)
    monitor.on_run_start(ctx, None)  # type: ignore[arg-type]
    monitor.on_generation_end(ctx, {"generation": 0, "eval/reward_mean": 1.0}, None)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        monitor.on_generation_end(ctx, record(1, 0.0, 0.0), None)  # type: ignore[arg-type]
        assert not caplog.records and TAG not in ctx.tags
        monitor.on_generation_end(ctx, record(2, 0.0, 0.0), None)  # type: ignore[arg-type]
        monitor.on_generation_end(ctx, record(3, 0.0, 0.0), None)  # type: ignore[arg-type]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "NOT LEARNING" in warnings[0] and "es.sigma" in warnings[0]
    assert ctx.tags[TAG] == "members_tie"


def test_a_tie_after_learning_is_a_stall_not_a_dead_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Members that tie after generations with a signal (a converged or saturated run) are
    reported as a run that stopped learning, not one that never could."""
    monitor, ctx = LearningMonitor(patience=2), context(tmp_path)
    monitor.on_run_start(ctx, None)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        for g in range(1, 4):
            monitor.on_generation_end(ctx, record(g, 0.3), None)  # type: ignore[arg-type]
        for g in range(4, 7):
            monitor.on_generation_end(ctx, record(g, 0.0, 0.0), None)  # type: ignore[arg-type]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "STOPPED LEARNING" in warnings[0], warnings
    assert "after 3 generations with a signal" in warnings[0]
    assert ctx.tags[TAG] == "members_stalled"


def test_a_static_mean_and_non_finite_fitness_are_reported(tmp_path: Path) -> None:
    monitor, ctx = LearningMonitor(patience=1), context(tmp_path)
    monitor.on_generation_end(ctx, record(1, 0.5, update=0.0), None)  # type: ignore[arg-type]
    assert ctx.tags[TAG] == "mean_static"
    monitor.on_generation_end(ctx, record(2, float("nan"), mean=float("nan")), None)  # type: ignore[arg-type]
    assert ctx.tags[TAG] == "no_fitness"


def test_differing_members_are_healthy(tmp_path: Path) -> None:
    monitor, ctx = LearningMonitor(patience=1), context(tmp_path)
    for g in range(1, 5):
        monitor.on_generation_end(ctx, record(g, 0.3), None)  # type: ignore[arg-type]
    assert not ctx.tags


def test_abort_raises_with_the_reason(tmp_path: Path) -> None:
    monitor, ctx = LearningMonitor(patience=1, abort=True), context(tmp_path)
    with pytest.raises(RunAborted, match="every member scored the same"):
        monitor.on_generation_end(ctx, record(1, 0.0, 0.0), None)  # type: ignore[arg-type]


# A perturbation far too small to change any greedy output: every member ties.
FROZEN = ["es.sigma=1e-12", "generations=3", "eval_every=3", "es.population_size=4"]


def test_a_run_that_cannot_learn_warns_and_is_tagged(
    tmp_path: Path, tiny_model_dir: str, mlflow_store: str
) -> None:
    out = tmp_path / "run"
    proc = run_cli([*FROZEN, "callbacks.health.patience=2", f"hydra.run.dir={out}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = proc.stdout + proc.stderr  # Hydra's logging config writes to stdout
    assert "THIS RUN IS NOT LEARNING" in said and "es.sigma" in said
    assert all(r["train/fitness_std"] == 0 for r in read_results(out)[1:])
    runs = mlflow.MlflowClient(mlflow_store).search_runs(
        [mlflow.get_experiment_by_name("evolm").experiment_id],
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    assert runs[0].data.tags[TAG] == "members_tie"


def test_abort_ends_the_run_with_one_message(tmp_path: Path, tiny_model_dir: str) -> None:
    out = tmp_path / "run"
    overrides = [*FROZEN, "callbacks.health.patience=1", "callbacks.health.abort=true"]
    proc = run_cli([*overrides, f"hydra.run.dir={out}", "logger=none"])
    assert proc.returncode == 3
    said = proc.stdout + proc.stderr
    assert "run aborted: every member scored the same" in said
    assert "Traceback" not in said
