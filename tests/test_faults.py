"""Fault injection: what a run survives (docs/robustness.md).

Processes sharing one fresh MLflow/Optuna store, a run SIGKILLed at many points (inside its
checkpoint and adapter writes too) then resumed, a scorer that dies mid-generation, a task whose
rewards are NaN/inf, damaged checkpoints and adapters. The core cases run in CI; the heavy ones
(many killed runs, parallel sweep workers) are marked slow.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from mlflow import MlflowClient
from optuna.trial import TrialState
from safetensors.torch import load_file, save_file

from evolm import metrics as M
from evolm.checkpoint import latest_checkpoint, save_checkpoint
from evolm.cli import export
from evolm.es import ESState
from evolm.lora import LoraLayout, LoraSpec, load_adapter
from evolm.lora.peft_io import CONFIG_FILE, WEIGHTS_FILE, AdapterError
from evolm.sweep.parent_run import KEY_TAG
from tests.conftest import free_port, wait_healthy
from tests.helpers import REPO, read_results, run_cli

# -- shared stores -------------------------------------------------------------------------------

CONCURRENT_OPEN = textwrap.dedent(
    """
    import math, sys, time
    from pathlib import Path
    import torch
    from evolm.es import ESState
    from evolm.callbacks import RunContext
    from evolm.lora import LoraLayout
    from evolm.callbacks.mlflow import MLflowLogger
    from evolm.sweep.parent_run import SweepRun
    from tests.helpers import generation_record

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
        logger.on_generation_end(ctx, generation_record(g, fitness_mean=g * 1.0), state)
    logger.on_run_end(ctx, {}, state)
    print("PARENT", parent.run_id, "RUN", logger.run_id)
    """
)


@pytest.mark.slow  # make test-all (CI: test_interrupt resumes a stopped run identically)
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


FRESH_RUNS = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import torch
    from evolm.es import ESState
    from evolm.callbacks import RunContext
    from evolm.lora import LoraLayout
    from evolm.callbacks.mlflow import MLflowLogger
    from tests.helpers import generation_record

    root, worker = Path(sys.argv[1]), sys.argv[2]
    workers, rounds = int(sys.argv[3]), int(sys.argv[4])
    for r in range(rounds):  # each round: every process opens one fresh store at the same moment
        store = root / f"round{r}"
        store.mkdir(exist_ok=True)
        (store / f"ready-{worker}").touch()
        while len(list(store.glob("ready-*"))) < workers:
            time.sleep(0.0005)
        uri = f"sqlite:///{store}/mlflow.db"
        logger = MLflowLogger(uri, run_name=worker, artifacts=[], retries=0)
        ctx = RunContext(store, 2, LoraLayout(targets=(), rank=1, alpha=1.0, num_layers=1), "base")
        state = ESState(mean=[torch.zeros(1)], seed=0)
        logger.on_run_start(ctx, state)
        logger.on_generation_end(ctx, generation_record(1, fitness_mean=1.0), state)
        logger.on_run_end(ctx, {}, state)
        print(r, logger.run_id, flush=True)
    """
)


@pytest.mark.slow  # make test-all (CI: test_interrupt resumes a stopped run identically)
def test_runs_creating_one_fresh_store_at_once_all_log_and_leave_it_usable(
    tmp_path: Path,
) -> None:
    """Plain runs (no sweep) whose first use of a sqlite store is at the same moment: every run
    is logged and the store opens afterwards (before the lock: `table _alembic_tmp_experiments
    already exists`, a run untracked, the store broken for every later run)."""
    workers, rounds = 4, 3
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", FRESH_RUNS, str(tmp_path), f"w{i}", str(workers), str(rounds)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(workers)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert "MLflow: could not" not in err, err[-3000:]
    for r in range(rounds):
        client = MlflowClient(f"sqlite:///{tmp_path}/round{r}/mlflow.db")
        exp = client.get_experiment_by_name("evolm")
        assert exp is not None, f"round {r}: no experiment"
        runs = client.search_runs([exp.experiment_id])
        assert sorted(run.info.run_name for run in runs) == [f"w{i}" for i in range(workers)]
        assert all(run.info.status == "FINISHED" for run in runs)
        assert all(run.data.metrics["train/fitness_mean"] == 1.0 for run in runs)
        later = client.create_run(exp.experiment_id)  # a later run still uses the store
        client.log_metric(later.info.run_id, "x", 1.0)


# -- NaN/inf rewards -----------------------------------------------------------------------------

POISON_TASK = '''
import math
from evolm.task.conciseness import Conciseness

class Poisoned(Conciseness):
    """Conciseness whose first `bad` members of every population score NaN (even) or inf (odd)."""

    def __init__(self, bad: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.bad = bad

    def score(self, examples, completions):
        scores = super().score(examples, completions)
        prompts = len({id(e) for e in examples})
        members = len(completions) // prompts
        if members > 1:  # a population, not the mean's eval
            for i in range(self.bad * prompts):
                scores["reward"][i] = math.nan if (i // prompts) % 2 == 0 else math.inf
        return scores
'''


def run_poisoned(tmp_path: Path, bad: int) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conf" / "task").mkdir(parents=True)
    (tmp_path / "poisoned.py").write_text(POISON_TASK)
    yaml = f"_target_: poisoned.Poisoned\nbad: {bad}\nmax_new_tokens: 8\n"
    (tmp_path / "conf" / "task" / "poisoned.yaml").write_text(yaml)
    return run_cli(
        [
            "--config-dir",
            "conf",
            "task=poisoned",
            "trusted_targets=[evolm.*,poisoned.*]",
            "generations=2",
            "eval_every=2",
            "es.population_size=8",
            "logger=none",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        timeout=180,
        cwd=tmp_path,
    )


@pytest.mark.slow  # make test-all (CI: test_interrupt resumes a stopped run identically)
def test_nan_and_inf_rewards_rank_worst_then_past_the_fraction_abort(tmp_path: Path) -> None:
    """2 of 8 members NaN/inf: they rank worst, the run goes on; 6 of 8: one message, exit 3."""
    (tmp_path / "few").mkdir()
    (tmp_path / "many").mkdir()
    ok = run_poisoned(tmp_path / "few", 2)
    assert ok.returncode == 0, ok.stderr[-3000:]
    train = read_results(tmp_path / "few" / "run")[1:]
    assert [r["train/fitness_nonfinite"] for r in train] == [2, 2]
    assert all(math.isfinite(r["train/fitness_mean"]) for r in train)
    assert all(math.isfinite(r["eval/reward_mean"]) for r in train[-1:])

    stopped = run_poisoned(tmp_path / "many", 6)
    out = stopped.stdout + stopped.stderr
    assert stopped.returncode == 3, out[-3000:]
    assert "run aborted: 6 of 8 members (75%) had a NaN or infinite fitness in generation 1" in out
    assert "callbacks.health.max_nonfinite=0.5" in out and "Traceback" not in out


# -- SIGKILL anywhere, then resume ---------------------------------------------------------------

KILL_ARGS = [
    "generations=6",
    "eval_every=2",
    "es.population_size=4",
    "task.max_new_tokens=8",
    "callbacks.checkpoint.every=2",
    "callbacks.checkpoint.keep=2",
    "callbacks.plot.min_interval_s=0",
]
ADAPTER = Path("adapter") / "adapter_model.safetensors"
# (point, n): SIGKILL the n-th time the run gets there (tests/fault_inject.py), mid-operation.
CORE_POINTS = [("adapter-weights", 1)]  # and ("checkpoint-data", 1): the random-kills test
SLOW_POINTS = [
    ("checkpoint-data", 2),
    ("generate", 5),
    ("generate", 1),  # before the first checkpoint: the resume starts again at generation 0
    ("checkpoint-digest", 3),  # the last checkpoint's .pt written, its digest not
    ("prune", 1),
    ("adapter-rename", 1),
    ("results", 4),
    ("eval", 2),
    ("mlflow", 3),
    ("plot", 4),
]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: str) -> Path:
    run_dir = tmp_path_factory.mktemp("faults") / "uninterrupted"
    proc = run_cli([*KILL_ARGS, f"hydra.run.dir={run_dir}", "logger=none"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def without_times(run_dir: Path) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in r.items() if not k.startswith("time/")} for r in read_results(run_dir)
    ]


def kill_then_resume(uninterrupted: Path, run_dir: Path, point: str, n: int) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    inject = [sys.executable, "-m", "tests.fault_inject", point, str(n)]
    killed = subprocess.run(
        [*inject, *KILL_ARGS, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (run_dir / ADAPTER).is_file() or point == "adapter-weights"
    resumed = run_cli([f"resume={run_dir}"], timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (run_dir / ADAPTER).read_bytes() == (uninterrupted / ADAPTER).read_bytes()
    assert without_times(run_dir) == without_times(uninterrupted)
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    runs = client.search_runs(
        [client.get_experiment_by_name("evolm").experiment_id],  # type: ignore[union-attr]
        filter_string=f"params.output_dir = '{run_dir}' and attributes.status = 'FINISHED'",
    )
    [run] = runs
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/fitness_mean")]
    assert sorted(steps) == list(range(1, 7))
    left = client.search_runs(
        [run.info.experiment_id],
        filter_string=f"params.output_dir = '{run_dir}' and attributes.status = 'RUNNING'",
    )
    assert not left, "a killed process's MLflow run is still RUNNING"


@pytest.mark.parametrize(("point", "n"), CORE_POINTS)
@pytest.mark.slow  # make test-all (CI: test_interrupt resumes a stopped run identically)
def test_sigkill_then_resume_is_byte_identical(
    uninterrupted: Path, tmp_path: Path, point: str, n: int
) -> None:
    kill_then_resume(uninterrupted, tmp_path / "run", point, n)


@pytest.mark.slow
@pytest.mark.parametrize(("point", "n"), SLOW_POINTS)
def test_sigkill_anywhere_then_resume_is_byte_identical(
    uninterrupted: Path, tmp_path: Path, point: str, n: int
) -> None:
    kill_then_resume(uninterrupted, tmp_path / "run", point, n)


KILLS_AT_RANDOM = 1  # after the first kill, at a fault point: each kill costs a process start


def kill_after_mlflow_start(run_dir: Path, delay_s: float) -> None:
    """``resume=run_dir``, SIGKILLed ``delay_s`` after it has opened its MLflow run."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "evolm", f"resume={run_dir}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "MLflow: " in line and " run " in line:
                break
        time.sleep(delay_s)
        assert proc.poll() is None, "the run ended before it could be killed"
    finally:
        proc.kill()
        proc.communicate()


def test_sigkill_at_random_moments_leaves_no_mlflow_run_running(
    uninterrupted: Path, tmp_path: Path
) -> None:
    """Issue 40, item 1: a run checkpointing every generation, SIGKILLed in the write of its
    first checkpoint (its MLflow run open, no checkpoint to name it), then its resumes killed
    at seeded random moments, then resumed to the end: ONE MLflow run holds it, FINISHED,
    every generation once, and none is left RUNNING (before: the first process's run stayed
    RUNNING for ever, and the resume opened a second one). The final adapter and records are
    the uninterrupted run's."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    args = [*KILL_ARGS, "callbacks.checkpoint.every=1", f"hydra.run.dir={run_dir}"]
    killed = subprocess.run(
        [sys.executable, "-m", "tests.fault_inject", "checkpoint-data", "1", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert latest_checkpoint(run_dir / "checkpoints") is None
    rng = random.Random(40)
    for _ in range(KILLS_AT_RANDOM):
        kill_after_mlflow_start(run_dir, rng.uniform(0.0, 1.0))
    resumed = run_cli([f"resume={run_dir}"], timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (run_dir / ADAPTER).read_bytes() == (uninterrupted / ADAPTER).read_bytes()
    assert without_times(run_dir) == without_times(uninterrupted)
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    runs = client.search_runs(
        [client.get_experiment_by_name("evolm").experiment_id],  # type: ignore[union-attr]
        filter_string=f"params.output_dir = '{run_dir}'",
    )
    assert [r.info.status for r in runs] == ["FINISHED"], [r.info for r in runs]
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, M.FITNESS_MEAN)]
    assert sorted(steps) == list(range(1, 7))


# -- damaged checkpoints and adapters ------------------------------------------------------------


def test_checkpoint_of_another_rank_is_an_error_naming_the_file(
    uninterrupted: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted, run_dir)
    newest = latest_checkpoint(run_dir / "checkpoints")
    assert newest is not None
    wrong = ESState(mean=[torch.zeros(3, 5)], seed=0, generation=newest.generation)
    save_checkpoint(run_dir / "checkpoints", wrong, newest.records, newest.state)
    proc = run_cli([f"resume={run_dir}"], timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    expected = f"checkpoint {newest.path} does not fit this run: it holds 1 LoRA tensors of shapes"
    assert f"resume: {expected} [(3, 5)]" in out
    assert "Traceback" not in out


def damaged_copies(adapter: Path, tmp_path: Path) -> dict[str, Path]:
    """Copies of a good adapter, each damaged one way; name -> directory."""
    out = {}
    for name in ("truncated", "corrupt-config", "no-weights", "other-rank"):
        out[name] = tmp_path / name / "adapter"
        shutil.copytree(adapter, out[name])
    weights = out["truncated"] / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:1000])
    config = out["corrupt-config"] / CONFIG_FILE
    config.write_text(config.read_text()[:20])
    (out["no-weights"] / WEIGHTS_FILE).unlink()
    other = json.loads((out["other-rank"] / CONFIG_FILE).read_text())
    (out["other-rank"] / CONFIG_FILE).write_text(json.dumps({**other, "r": other["r"] + 1}))
    return out


def test_damaged_adapters_are_errors_naming_the_file(
    uninterrupted: Path, tmp_path: Path, tiny_model_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    from transformers import AutoConfig

    config = json.loads((uninterrupted / "adapter" / CONFIG_FILE).read_text())
    layout = LoraLayout.from_hf_config(
        AutoConfig.from_pretrained(tiny_model_dir), LoraSpec(rank=config["r"])
    )
    load_adapter(uninterrupted / "adapter", layout)  # the good one loads
    expected = {
        "truncated": f"{WEIGHTS_FILE} cannot be read (truncated or corrupt)",
        "corrupt-config": f"{CONFIG_FILE} is not valid JSON (truncated or corrupt)",
        "no-weights": f"{WEIGHTS_FILE} does not exist",
        "other-rank": f"{CONFIG_FILE}: r={config['r'] + 1}, lora_alpha",
    }
    for name, adapter in damaged_copies(uninterrupted / "adapter", tmp_path).items():
        with pytest.raises(AdapterError) as info:
            load_adapter(adapter, layout)
        assert str(adapter) in str(info.value) and expected[name] in str(info.value), name
        if name != "other-rank":  # export checks the files before it loads the base model
            caplog.clear()
            assert export.main([str(adapter.parent)]) == 2
            assert str(adapter) in caplog.text and expected[name] in caplog.text
    # weights of another rank under a config that claims this one
    swapped = tmp_path / "swapped" / "adapter"
    shutil.copytree(uninterrupted / "adapter", swapped)
    state = {
        k: torch.zeros(v.shape[0] + 1, v.shape[1])
        for k, v in load_file(str(swapped / WEIGHTS_FILE)).items()
    }
    save_file(state, str(swapped / WEIGHTS_FILE))
    with pytest.raises(AdapterError, match=r"has shape .* \(another rank or model\?\)") as info:
        load_adapter(swapped, layout)
    assert str(swapped / WEIGHTS_FILE) in str(info.value)


# -- the scorer dies mid-run ---------------------------------------------------------------------

SCORER_ARGS = [
    "task=scorer",
    "generations=8",
    "eval_every=4",
    "es.population_size=4",
    "task.max_new_tokens=8",
    "task.samples_per_generation=4",
    "logger=none",
]


class ScorerProcess:
    """``python -m evolm.task.scorer.server`` on a fixed port, killed and restarted at will."""

    def __init__(self, tmp_path: Path) -> None:
        self.port, self.tmp_path = free_port(), tmp_path
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = self.tmp_path / f"scorer-{time.monotonic_ns()}.log"
        cmd = [sys.executable, "-m", "evolm.task.scorer.server", "--host", "127.0.0.1"]
        with open(log, "w") as f:
            self.proc = subprocess.Popen(
                [*cmd, "--port", str(self.port)], stdout=f, stderr=subprocess.STDOUT, cwd=REPO
            )
        wait_healthy(self.url, self.proc, log)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def scorer(tmp_path: Path) -> Iterator[ScorerProcess]:
    server = ScorerProcess(tmp_path)
    server.start()
    yield server
    if server.proc is not None and server.proc.poll() is None:
        server.kill()


def start_run(run_dir: Path, url: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    cmd = [sys.executable, "-m", "evolm", *SCORER_ARGS, f"task.url={url}", *args]
    return subprocess.Popen(
        [*cmd, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def kill_scorer_after(run_dir: Path, scorer: ScorerProcess, proc: subprocess.Popen, g: int) -> None:
    """SIGKILL the scorer once the run has finished generation ``g`` (it is scoring the next)."""
    results = run_dir / "results.jsonl"
    deadline = time.monotonic() + 240
    while not (results.is_file() and len(results.read_text().splitlines()) > g):
        assert proc.poll() is None and time.monotonic() < deadline, "the run did not get there"
        time.sleep(0.01)
    scorer.kill()


@pytest.mark.slow  # make test-all (CI: test_interrupt resumes a stopped run identically)
def test_scorer_killed_mid_run_is_retried_and_nothing_is_lost(
    scorer: ScorerProcess, tmp_path: Path, tiny_model_dir: str
) -> None:
    """Killed after generation 2 and back 1.5 s later: the requests are retried (backoff), the
    run ends exactly as an undisturbed one."""
    baseline = start_run(tmp_path / "baseline", scorer.url)
    assert baseline.wait(timeout=300) == 0, baseline.stdout.read()[-3000:]  # type: ignore[union-attr]
    run_dir = tmp_path / "disturbed"
    proc = start_run(run_dir, scorer.url, "task.retries=6", "task.backoff_s=0.5")
    kill_scorer_after(run_dir, scorer, proc, 2)
    time.sleep(1.5)
    scorer.start()
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out[-3000:]
    assert "failed (attempt 1)" in out and "retrying" in out
    assert without_times(run_dir) == without_times(tmp_path / "baseline")


@pytest.mark.slow  # make test-all
def test_scorer_that_stays_down_is_one_error_after_bounded_retries(
    scorer: ScorerProcess, tmp_path: Path, tiny_model_dir: str
) -> None:
    run_dir = tmp_path / "run"
    proc = start_run(run_dir, scorer.url, "task.retries=2", "task.backoff_s=0.1")
    kill_scorer_after(run_dir, scorer, proc, 1)
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 4, out[-3000:]
    assert f"run failed: scorer service at task.url={scorer.url} gave no usable answer" in out
    assert "after 3 attempt(s)" in out and "Traceback" not in out
    assert f"python -m evolm resume={run_dir}" in out
    assert (run_dir / "config.yaml").is_file()  # a started run keeps its directory


# -- parallel sweep workers on one fresh study ---------------------------------------------------


@pytest.mark.slow
def test_sweep_workers_started_at_once_lose_no_trial_and_share_one_parent(
    tmp_path: Path, tiny_model_dir: str
) -> None:
    """launchers/sweep_workers.sh, both workers at the same moment on fresh stores (before: both
    created the MLflow tables at once and one worker's trials had no parent run)."""
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
        "STAGGER_S": "0",
        "HF_HUB_OFFLINE": "1",
        "TQDM_DISABLE": "1",
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
    }
    budget = ["generations=1", "es.population_size=4", "task.max_new_tokens=8", "eval_every=1"]
    proc = subprocess.run(
        ["bash", str(REPO / "launchers" / "sweep_workers.sh"), "2", "2", *budget],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    logs = "".join(p.read_text() for p in tmp_path.glob("outputs/multiruns/*/*/worker*.out"))
    assert proc.returncode == 0, proc.stderr[-2000:] + logs[-3000:]
    [study] = optuna.get_all_study_summaries(f"sqlite:///{tmp_path}/outputs/optuna.db")
    trials = optuna.load_study(
        study_name=study.study_name, storage=f"sqlite:///{tmp_path}/outputs/optuna.db"
    ).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("evolm").experiment_id])  # type: ignore[union-attr]
    [parent] = [r for r in runs if KEY_TAG in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 4 and len(runs) == 5, "every trial a child of the one parent"
