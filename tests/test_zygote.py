"""The tests' forked CLI (tests/zygote.py) behaves as ``python -m evolm`` does: the same exit
codes, output and files; runs whose environment changes an import go to a plain subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ZYGOTE, run_cli


def digitless(text: str) -> str:
    """``text`` without its times and dates (every digit a 0)."""
    return re.sub(r"[0-9]", "0", text)


def plain(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", **env}
    return subprocess.run(
        [sys.executable, "-m", "evolm", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=full,
    )


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
    assert ZYGOTE.serves({**ZYGOTE._start_env(), **env})
    forked = run_cli(args, timeout=120, cwd=tmp_path, env=env)
    reference = plain(args, tmp_path, env)
    assert forked.returncode == reference.returncode
    assert digitless(forked.stdout) == digitless(reference.stdout)
    # the same messages; a traceback's frames differ (runpy's own, or the zygote's, at the top)
    assert ("Traceback" in forked.stderr) == ("Traceback" in reference.stderr)
    assert (
        digitless(forked.stderr).splitlines()[-1:] == digitless(reference.stderr).splitlines()[-1:]
    )


def test_runs_that_change_an_import_go_to_a_plain_subprocess() -> None:
    base = ZYGOTE._start_env()
    assert ZYGOTE.serves({**base, "MLFLOW_TRACKING_URI": "sqlite:///x.db"})
    assert not ZYGOTE.serves({**base, "PYTHONPATH": "/elsewhere"})
    assert not ZYGOTE.serves({**base, "OMP_NUM_THREADS": "7"})
    assert not ZYGOTE.serves({k: v for k, v in base.items() if k != "HF_HUB_OFFLINE"})


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
