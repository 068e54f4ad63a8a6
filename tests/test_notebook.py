"""notebooks/analysis.ipynb executes headless (nbclient) against the store of a short run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from nbclient import NotebookClient

from tests.helpers import REPO

NOTEBOOK = REPO / "notebooks" / "analysis.ipynb"


def add_sweep(uri: str) -> None:
    """Two child runs of a sweep parent, differing in es.sigma, beside the real run."""
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("evolm")
    assert experiment is not None
    parent = client.create_run(experiment.experiment_id, run_name="sweep").info.run_id
    trials = (("trial-a", 0.01, -20.0, 0.02), ("trial-b", 0.1, -5.0, 0.5))  # both on the front
    for name, sigma, final, kl in trials:
        run = client.create_run(
            experiment.experiment_id,
            run_name=name,
            tags={"mlflow.parentRunId": parent},
        ).info.run_id
        metrics = [Metric("train/fitness_mean", -30.0 + g, 0, g) for g in (1, 2)]
        metrics += [
            Metric(f"train/fitness_p{q}", -30.0 + g + d, 0, g)
            for g in (1, 2)
            for q, d in (("20", -3), ("80", 3))
        ]
        metrics += [Metric("eval/reward_mean", v, 0, g) for g, v in ((0, -30.0), (2, final))]
        metrics += [Metric("eval/kl_mean", v, 0, g) for g, v in ((0, 0.0), (2, kl))]
        params = [Param("es.sigma", str(sigma)), Param("generations", "2")]
        client.log_batch(run, metrics=metrics, params=params, tags=[RunTag("task", "x")])
        client.set_terminated(run)


def test_analysis_notebook_executes(
    short_run: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, uri = short_run
    db = tmp_path / "mlflow.db"
    shutil.copy(uri.removeprefix("sqlite:///"), db)  # the short run, plus a sweep
    add_sweep(f"sqlite:///{db}")
    monkeypatch.setenv("EVOLM_MLFLOW_URI", f"sqlite:///{db}")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "clear outputs"
    NotebookClient(
        nb, timeout=120, resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "3 run(s) in experiment 'evolm'" in text
    assert "2 trial(s); parameters that vary: ['es.sigma']" in text
    assert "best: trial-b" in text
    assert "Pareto front: 2 of 2 trial(s)" in text
    assert "base model: eval/reward_mean = -30 at KL 0" in text
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 3  # the curves, the sweep's scatter, the reward-vs-KL front


@pytest.mark.slow  # make test-all
def test_the_documented_headless_command_runs(short_run: tuple[Path, str], tmp_path: Path) -> None:
    """The command the notebook names runs in the project's venv (before: `jupyter nbconvert`,
    which the venv lacks: `jupyter-nbconvert not found`)."""
    _, uri = short_run
    intro = nbformat.read(NOTEBOOK, as_version=4).cells[0].source
    [command] = re.findall(r"`(jupyter [^`]+)`", intro)
    copy = tmp_path / "analysis.ipynb"
    shutil.copy(NOTEBOOK, copy)
    jupyter = Path(sys.executable).parent / "jupyter"
    args = [str(jupyter), *command.split()[1:-1], "--inplace", copy.name]
    env = {**os.environ, "EVOLM_MLFLOW_URI": uri, "MPLBACKEND": "Agg"}
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    executed = nbformat.read(copy, as_version=4)
    text = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert "run(s) in experiment 'evolm'" in text
