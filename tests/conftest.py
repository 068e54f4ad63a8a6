"""Shared fixtures: one tiny model per test session, built offline into a temp cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session", autouse=True)
def evolm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every model evolm builds in this session (and its subprocesses) goes here."""
    cache = Path(os.environ.get("EVOLM_TEST_CACHE") or tmp_path_factory.mktemp("evolm-cache"))
    os.environ["EVOLM_CACHE_DIR"] = str(cache)
    return cache


@pytest.fixture(scope="session")
def tiny_model_dir(evolm_cache: Path) -> str:
    from evolm.model import TinyModel

    return TinyModel().resolve()


@pytest.fixture(scope="session", autouse=True)
def mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Runs in this session (and their subprocesses) log to a temporary MLflow sqlite store,
    never to the repository's outputs/mlflow.db (``logger=mlflow`` is the default)."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    return uri


SHORT_RUN = ["generations=4", "eval_every=2", "es.population_size=4", "task.max_new_tokens=8"]


@pytest.fixture(scope="session")
def short_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: str) -> tuple[Path, str]:
    """``(run dir, store URI)`` of one short CLI run, alone in its own MLflow sqlite store."""
    from tests.helpers import run_cli

    root = tmp_path_factory.mktemp("short-run")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    run_dir = root / "run"
    proc = run_cli(
        [*SHORT_RUN, f"hydra.run.dir={run_dir}"], timeout=180, env={"MLFLOW_TRACKING_URI": uri}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir, uri
