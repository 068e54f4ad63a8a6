"""The offline install (docs/offline.md): runs with ``logger=none`` need neither mlflow nor optuna.

``make wheelhouse`` leaves both out (they and their dependencies are most of evolm's install), so
evolm must import mlflow only for ``logger=mlflow`` and optuna only for sweeps. Checked on the
real CLI with both made unimportable, as on a machine where they are not installed.
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers import env_without, read_results, run_cli


def test_a_run_without_mlflow_and_optuna(tmp_path: Path, tiny_model_dir: str) -> None:
    out = tmp_path / "run"
    proc = run_cli(
        ["debug=fast", "logger=none", f"output_dir={out}", f"hydra.run.dir={out}"],
        timeout=240,
        env=env_without(tmp_path, "mlflow", "optuna"),
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert read_results(out)[-1]["generation"] >= 1


def test_logger_mlflow_without_mlflow_is_a_config_error(tmp_path: Path) -> None:
    """Before: 4 attempts to start an MLflow run, then a warning about an unreachable store,
    and an untracked run. Now: one message naming the install and logger=none, exit 2."""
    out = tmp_path / "run"
    proc = run_cli(
        ["debug=fast", f"output_dir={out}", f"hydra.run.dir={out}"],
        timeout=240,
        env=env_without(tmp_path, "mlflow", "optuna"),
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-3000:]
    assert "bad configuration: logger.mlflow._target_: logger=mlflow (the default)" in text
    assert "pip install mlflow==3.17.2" in text and "logger=none" in text
    assert "Traceback" not in text and not out.exists()
