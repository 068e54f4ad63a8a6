"""Fault injection: what a run survives (docs/robustness.md).

Processes sharing one fresh MLflow/Optuna store, a run SIGKILLed at many points (inside its
checkpoint and adapter writes too) then resumed, a scorer that dies mid-generation, a task whose
rewards are NaN/inf, damaged checkpoints and adapters. The core cases run in CI; the heavy ones
(many killed runs, parallel sweep workers) are marked slow.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from mlflow import MlflowClient

from tests.helpers import REPO

# -- shared stores -------------------------------------------------------------------------------

CONCURRENT_OPEN = textwrap.dedent(
    """
    import math, sys, time
    from pathlib import Path
    import torch
    from evolm.es import ESState
    from evolm.loop import RunContext
    from evolm.lora import LoraLayout
    from evolm.tracking.mlflow import MLflowLogger
    from evolm.tracking.sweep import SweepRun

    root, start, worker = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    uri = f"sqlite:///{root}/mlflow.db"
    while time.time() < start:  # every process opens the fresh store at the same moment
        time.sleep(0.001)
    parent = SweepRun(uri, "evolm", "study", f"sqlite:///{root}/optuna.db")
    logger = MLflowLogger(uri, parent_run_id=parent.run_id, run_name=worker, artifacts=[])
    ctx = RunContext(root, 2, LoraLayout(targets=(), rank=1, alpha=1.0, num_layers=1), "base")
    state = ESState(mean=[torch.zeros(1)], seed=0)
    logger.on_run_start(ctx, state)
    for g in (1, 2):
        logger.on_generation_end(ctx, {"generation": g, "train/fitness_mean": g * 1.0}, state)
    logger.on_run_end(ctx, {}, state)
    print("PARENT", parent.run_id, "RUN", logger.run_id)
    """
)


def test_processes_opening_one_fresh_store_lose_no_run_and_share_the_parent(
    tmp_path: Path,
) -> None:
    """Sweep workers and runs that create the MLflow tables at once (before: `duplicate column
    name`, alembic `Online migration expected to match one row`, a worker without parent)."""
    n = 3
    start = time.time() + 5  # after every interpreter has imported mlflow
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT_OPEN, str(tmp_path), str(start), f"w{i}"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    parents = {out.split()[1] for out, _ in outs}
    assert len(parents) == 1, f"one parent run for the study, got {parents}"
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("evolm").experiment_id])  # type: ignore[union-attr]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") in parents]
    assert sorted(r.info.run_name for r in children) == [f"w{i}" for i in range(n)]
    for run in children:
        steps = client.get_metric_history(run.info.run_id, "train/fitness_mean")
        assert sorted(m.step for m in steps) == [1, 2] and run.info.status == "FINISHED"
