"""A bad start fails in seconds, before any model loads, with one message naming the key and the
fix, exits non-zero without a traceback and leaves no run directory behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from evolm.errors import ConfigError
from evolm.model.spec import HubModel
from evolm.task.scorer import Scorer
from tests.conftest import StartServer, free_port
from tests.helpers import run_cli


def runs_left(cwd: Path) -> list[Path]:
    """Run directories under the default ``outputs/runs/<date>/<time>``."""
    return sorted((cwd / "outputs" / "runs").glob("*/*"))


def test_scorer_not_running_fails_before_the_model_loads(tmp_path: Path) -> None:
    """Before: the model loaded and an MLflow run opened, then a ~70-line traceback ending in
    ScorerUnavailable, a FAILED MLflow run and an almost empty run directory."""
    port = free_port()  # nothing listens there
    proc = run_cli(
        ["task=scorer", f"task.url=http://127.0.0.1:{port}", "task.backoff_s=0.05"],
        timeout=120,
        cwd=tmp_path,
        env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert f"task.url: no scorer service answers at http://127.0.0.1:{port}" in out
    assert "python -m evolm.task.scorer.server" in out and "Traceback" not in out
    assert "loaded" not in out and "MLflow:" not in out  # no model, no MLflow run
    assert not (tmp_path / "mlflow.db").exists()
    assert runs_left(tmp_path) == []


def refused_offline_hub_run(tmp_path: Path, *overrides: str) -> str:
    """A run of a hub model absent from an empty offline cache: its refusal (exit 2, no run
    directory left), the output returned."""
    proc = run_cli(
        ["model=qwen2.5-0.5b-instruct", *overrides, "logger=none"],
        timeout=120,
        cwd=tmp_path,
        env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hf")},  # an empty cache
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert runs_left(tmp_path) == []
    return out


def test_hub_model_not_on_disk_names_the_key_and_the_fix(tmp_path: Path) -> None:
    """Before: a 47-line transformers traceback (`We couldn't connect to huggingface.co`)."""
    out = refused_offline_hub_run(tmp_path)
    assert "model.name_or_path: hub model 'Qwen/Qwen2.5-0.5B-Instruct' is not on disk" in out
    assert "hf download Qwen/Qwen2.5-0.5B-Instruct" in out and "HF_HUB_OFFLINE" in out
    assert "Traceback" not in out


def test_removed_waves_batching_is_refused_before_the_model(tmp_path: Path) -> None:
    """``server.batching=waves`` (the lock-step path, removed) names the key and why, before the
    model is even looked for (a hub model absent from an empty offline cache: its error would
    come first otherwise)."""
    out = refused_offline_hub_run(tmp_path, "server.batching=waves")
    assert "server.batching: batching=waves (the lock-step path) was removed" in out
    assert "continuous batching replaced it" in out and "2.9x" in out
    assert "not on disk" not in out and "Traceback" not in out


def test_full_error_shows_the_traceback(tmp_path: Path) -> None:
    proc = run_cli(
        ["lora.rank=0", "logger=none"], timeout=120, cwd=tmp_path, env={"HYDRA_FULL_ERROR": "1"}
    )
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "lora.rank: must be >= 1" in proc.stderr


# -- in process ----------------------------------------------------------------------------------


def test_preflight_checks_the_scorer(start_server: StartServer) -> None:
    Scorer(url=start_server()).preflight()  # a running service: fine
    dead = Scorer(url=f"http://127.0.0.1:{free_port()}", retries=1, backoff_s=0.01)
    with pytest.raises(ConfigError, match="no scorer service answers") as info:
        dead.preflight()
    assert info.value.key == "url" and "connection refused" in str(info.value)


def test_hub_model_offline_without_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ConfigError, match="is not on disk") as info:
        HubModel("Qwen/Qwen2.5-0.5B-Instruct").resolve()
    assert info.value.key == "name_or_path" and "unset HF_HUB_OFFLINE" in info.value.fix
