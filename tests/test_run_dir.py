"""The run directory (evolm.cli.rundir): every rank of a distributed run uses the one rank 0 claimed
(issue 24 item 3, issue 31 item 4), a new run never starts in a directory that holds another run
(issue 31 item 5), and one process at a time runs in a run directory (issue 31 item 3)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from evolm import dist
from evolm.cli.rundir import claim
from evolm.server.connection import free_port
from tests.helpers import REPO, gloo_env, read_results, run_cli
from tests.test_dist import torchrun

OTHER_RUN = "other-run.txt"  # what a directory that belongs to another run holds here


def _env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TQDM_DISABLE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
        **extra,
    }


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# -- ranks agree on the directory ----------------------------------------------------------------
def _claim_worker(rank: int, port: int, root: str) -> None:
    env = gloo_env(rank, 2, port)
    os.environ.update(env)
    dist.setup(env, timeout_s=60)
    try:
        claimed = {}
        for name in ("taken", "free"):
            if rank == 0:
                time.sleep(1.0)  # rank 1 gets there first
            got = claim(str(Path(root) / name))
            Path(got).mkdir(parents=True, exist_ok=True)  # as Hydra does on every rank
            (Path(got) / f"rank{rank}.log").write_text("")
            claimed[name] = got
        (Path(root) / f"claimed{rank}.json").write_text(json.dumps(claimed))
    finally:
        dist.teardown()


def test_gloo_ranks_take_the_directory_rank_0_claimed(tmp_path: Path) -> None:
    """Two gloo processes, rank 1 first: both get rank 0's directory, ``taken-1`` when
    ``taken`` belongs to another run (before, rank 1 logged into the other run's folder), and
    ``free`` itself when nothing is there (before, rank 1 created it first and pushed rank 0 to
    ``free-1``)."""
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / OTHER_RUN).write_text("mine")
    mp.spawn(_claim_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    claimed = [json.loads((tmp_path / f"claimed{r}.json").read_text()) for r in (0, 1)]
    assert claimed[0] == claimed[1]
    assert claimed[0] == {"taken": f"{tmp_path}/taken-1", "free": f"{tmp_path}/free"}
    assert sorted(p.name for p in (tmp_path / "taken").iterdir()) == [OTHER_RUN]
    assert sorted(p.name for p in (tmp_path / "taken-1").iterdir()) == ["rank0.log", "rank1.log"]
    assert not (tmp_path / "free-1").exists()


def _take_the_next_seconds(runs: Path, seconds: int) -> list[Path]:
    """Directories ``<date>/<time>/`` of another run for every second of the next ``seconds``."""
    start = datetime.now()
    taken = []
    for s in range(seconds):
        at = start + timedelta(seconds=s)
        path = runs / at.strftime("%Y-%m-%d") / at.strftime("%H-%M-%S")
        path.mkdir(parents=True, exist_ok=True)
        (path / OTHER_RUN).write_text("mine")
        taken.append(path)
    return taken


@pytest.mark.slow
def test_torchrun_ranks_share_one_directory_when_its_time_is_taken(
    tiny_model_dir: str, tmp_path: Path
) -> None:
    """``torchrun --nproc_per_node=2 -m evolm debug=fast logger=none`` (gloo) while
    ``outputs/runs/<date>/<time>/`` is another run's: the run, rank 1's log included, is all in
    ``<time>-1/`` and the other run's folder is untouched."""
    runs = tmp_path / "outputs" / "runs"
    taken = _take_the_next_seconds(runs, 180)
    cmd = torchrun("--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={free_port()}")
    proc = subprocess.run(
        [*cmd, "debug=fast", "generations=1", "logger=none"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert all(sorted(p.name for p in t.iterdir()) == [OTHER_RUN] for t in taken)
    [run] = [p for p in runs.glob("*/*") if p not in taken]
    assert run.name.endswith("-1") and run.parent / run.name[:-2] in taken
    assert (run / "rank1.log").is_file() and (run / "adapter").is_dir()
    assert len(read_results(run)) == 2  # generation 0 (the start's eval) and 1


# -- a new run in another run's directory ---------------------------------------------------------
@pytest.mark.parametrize("key", ["hydra.run.dir", "output_dir"])
def test_new_run_in_a_directory_holding_a_run_is_refused(
    key: str, short_run: tuple[Path, str], tmp_path: Path
) -> None:
    """Pointed at a finished run's directory, a new run (another seed) stops before it touches
    anything (before: it started there and rewrote the first run's results.jsonl), and says to
    resume it or pick another directory; the directory it claimed for itself is removed."""
    run = tmp_path / "run"
    shutil.copytree(short_run[0], run)
    before = snapshot(run)
    work = tmp_path / "cwd"
    work.mkdir()
    proc = run_cli([f"{key}={run}", "seed=1", "logger=none"], timeout=120, cwd=work, env=_env())
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"bad configuration: {key}: {run} already holds a run (config.yaml" in proc.stderr
    assert f"resume={run}" in proc.stderr and "Traceback" not in proc.stderr
    assert snapshot(run) == before
    assert not list(work.glob("outputs/runs/*")), "nothing of the refused run is left"


# -- one process per run directory ------------------------------------------------------------
LONG = [
    "generations=100000",
    "es.population_size=4",
    "task.max_new_tokens=8",
    "eval_every=1000",
    "callbacks.checkpoint.every=2",
    "logger=none",
]


def _wait_for(condition: object, proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert proc.poll() is None, f"the run exited ({proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.05)


@pytest.mark.slow  # make test-all
def test_second_process_on_a_run_directory_is_refused(tiny_model_dir: str, tmp_path: Path) -> None:
    """A run SIGKILLed leaves no lock behind (its resume starts); a second ``resume=`` of the
    directory while that resume runs is refused with one message naming it (before: both ran
    and interleaved results.jsonl); the running one keeps every generation once."""
    run = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-m", "evolm", *LONG, f"hydra.run.dir={run}"],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        checkpoint = run / "checkpoints" / "gen-000002.pt.sha256"
        _wait_for(checkpoint.exists, first, "a checkpoint")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    log = tmp_path / "resume.log"
    with open(log, "w") as out:
        resumed = subprocess.Popen(
            [sys.executable, "-m", "evolm", f"resume={run}"],
            cwd=tmp_path,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_for(lambda: "resuming" in log.read_text(), resumed, "'resuming' in its log")
        second = run_cli([f"resume={run}"], timeout=60, cwd=tmp_path, env=_env())
        assert resumed.poll() is None, "the first resume must still be running"
    finally:
        resumed.send_signal(signal.SIGKILL)
        resumed.wait()
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    expected = f"bad configuration: resume: {run} is in use by another evolm process"
    assert expected in second.stderr and "Traceback" not in second.stderr
    generations = [r["generation"] for r in read_results(run)]
    assert generations == list(range(len(generations))) and len(generations) > 3
