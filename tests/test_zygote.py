"""The tests' forked CLI (tests/zygote.py) behaves as ``python -m evolm`` does: the same exit
codes, output and files; runs whose environment changes an import go to a plain subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import ZYGOTE, read_results, run_cli
from tests.zygote import PER_RUN_ENV


@pytest.fixture(autouse=True)
def zygote_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The zygote on (even with ``EVOLM_TEST_ZYGOTE=0``), and the tests' environment as the
    zygote's outside :data:`PER_RUN_ENV`."""
    monkeypatch.setattr(ZYGOTE, "off", False)
    base = ZYGOTE.base_env()
    for key in set(os.environ) - PER_RUN_ENV - set(base):
        monkeypatch.delenv(key)
    for key, value in base.items():
        if key not in PER_RUN_ENV and key not in ("HF_HUB_OFFLINE", "TQDM_DISABLE"):
            monkeypatch.setenv(key, value)


def digitless(text: str) -> str:
    """``text`` without its times and dates (every digit a 0)."""
    return re.sub(r"[0-9]", "0", text)


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["lora.rank=0", "logger=none"], {}),  # a config error: exit 2, one line
        (["lora.rank=0", "logger=none"], {"HYDRA_FULL_ERROR": "1"}),  # Hydra's traceback: 1
        (["--cfg", "job", "es.sigma=0.25"], {}),  # Hydra's own exit 0 with stdout
    ],
)
def test_a_forked_run_exits_and_prints_as_a_plain_one(
    tmp_path: Path, args: list[str], env: dict[str, str]
) -> None:
    before = ZYGOTE.last_pid
    forked = run_cli(args, timeout=120, cwd=tmp_path, env=env)
    assert ZYGOTE.last_pid not in (before, 0)  # it forked
    reference = run_cli(args, timeout=120, cwd=tmp_path, env=env, fresh=True)
    assert forked.returncode == reference.returncode
    assert digitless(forked.stdout) == digitless(reference.stdout)
    # the same messages; a traceback's frames differ (runpy's own, or the zygote's, at the top)
    assert ("Traceback" in forked.stderr) == ("Traceback" in reference.stderr)
    assert (
        digitless(forked.stderr).splitlines()[-1:] == digitless(reference.stderr).splitlines()[-1:]
    )


def test_a_forked_training_run_writes_what_a_fresh_one_writes(
    tmp_path: Path, tiny_model_dir: str
) -> None:
    """Two generations of the default demo, forked and in a fresh interpreter (another hash
    seed): the same records and the same adapter bytes."""
    args = ["generations=2", "logger=none"]
    forked, fresh = tmp_path / "forked", tmp_path / "fresh"
    before = ZYGOTE.last_pid
    assert run_cli([*args, f"hydra.run.dir={forked}"], timeout=180).returncode == 0
    assert ZYGOTE.last_pid not in (before, 0)
    proc = run_cli([*args, f"hydra.run.dir={fresh}"], timeout=180, fresh=True)
    assert proc.returncode == 0, proc.stderr[-2000:]

    def records(run: Path) -> list[dict[str, object]]:
        return [
            {k: v for k, v in r.items() if not k.startswith("time/")} for r in read_results(run)
        ]

    assert len(records(forked)) == 3 and records(forked) == records(fresh)
    adapter = Path("adapter") / "adapter_model.safetensors"
    assert (forked / adapter).read_bytes() == (fresh / adapter).read_bytes()


def test_runs_that_change_an_import_go_to_a_plain_subprocess() -> None:
    base = ZYGOTE.base_env()
    assert ZYGOTE.serves({**base, "MLFLOW_TRACKING_URI": "sqlite:///x.db"})
    assert not ZYGOTE.serves({**base, "PYTHONPATH": "/elsewhere"})
    assert not ZYGOTE.serves({**base, "OMP_NUM_THREADS": "7"})
    assert not ZYGOTE.serves({k: v for k, v in base.items() if k != "HF_HUB_OFFLINE"})
    assert ZYGOTE.counts["plain: the environment sets OMP_NUM_THREADS"] >= 1
    assert "plain" in ZYGOTE.summary() and "PYTHONPATH" in ZYGOTE.summary()


def test_a_variable_set_in_the_tests_process_is_gone_after_the_test_1() -> None:
    """What code run in-process sets (as the MLflow callback sets MLflow's request settings)
    does not outlive the test: the next test checks."""
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = "1234"
    os.environ["EVOLM_LEAK_PROBE"] = "1"


def test_a_variable_set_in_the_tests_process_is_gone_after_the_test_2() -> None:
    assert os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT") != "1234"
    assert "EVOLM_LEAK_PROBE" not in os.environ


def test_a_run_past_its_timeout_is_killed(tmp_path: Path) -> None:
    before = ZYGOTE.last_pid
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli(["generations=100000", "logger=none"], timeout=3, cwd=tmp_path)
    assert time.monotonic() - started < 60
    assert ZYGOTE.last_pid not in (before, 0)  # a forked run
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(ZYGOTE.last_pid, 0)
    assert run_cli(["lora.rank=0", "logger=none"], timeout=60, cwd=tmp_path).returncode == 2
