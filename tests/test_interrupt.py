"""SIGTERM (kill, schedulers, container stops, torchrun forwarding its own stop) stops a run like
Ctrl-C: the last finished generation is checkpointed, the MLflow run ends KILLED, the resume
command is logged, the exit code is 143; ``resume=`` then ends exactly as an uninterrupted run.

Before: the default action of SIGTERM ended the process at once (exit 143): MLflow RUNNING, no
checkpoint of the generations since the last periodic one."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from mlflow import MlflowClient
from sqlalchemy import event
from sqlalchemy.engine import Engine

from evolm import interrupt
from evolm.callbacks import Callback, RunContext
from evolm.callbacks.checkpoint import Checkpointer
from evolm.callbacks.mlflow import MLflowLogger
from evolm.checkpoint import checkpoints, latest_checkpoint
from evolm.es import ESState
from evolm.loop import ESLoop
from evolm.lora import LoraLayout
from evolm.server.connection import free_port
from evolm.task.scorer import Scorer
from tests.helpers import REPO, generation_record, read_results, run_cli

ARGS = [
    "generations=40",
    "eval_every=10",
    "es.population_size=4",
    "task.max_new_tokens=8",
    "callbacks.checkpoint.every=20",  # no periodic checkpoint before the signal
    "callbacks.plot.min_interval_s=60",
]
ADAPTER = Path("adapter") / "adapter_model.safetensors"


def without_times(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


def env(store: str) -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TQDM_DISABLE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
        "MLFLOW_TRACKING_URI": store,
    }


def mlflow_run(store: str, run_dir: Path) -> Any:
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("evolm")
    assert experiment is not None
    [run] = client.search_runs(
        [experiment.experiment_id], filter_string=f"params.output_dir = '{run_dir}'"
    )
    return run


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: str) -> Path:
    run_dir = tmp_path_factory.mktemp("sigterm") / "uninterrupted"
    proc = run_cli([*ARGS, "logger=none", f"hydra.run.dir={run_dir}"], timeout=180, fresh=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def terminate_after_first_generation(cmd: list[str], run_dir: Path, store: str) -> tuple[int, str]:
    """Start ``cmd``, SIGTERM it once generation 1 is in ``results.jsonl``; its exit code and
    output."""
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env(store), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        results = run_dir / "results.jsonl"
        deadline = time.monotonic() + 120
        while not results.exists() or len(results.read_text().splitlines()) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "no generation finished"
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "SIGTERM received: stopping the run" in out, out[-3000:]
    return proc.returncode, out


def check_stopped_and_resume(run_dir: Path, store: str, uninterrupted: Path) -> None:
    """The stopped run's state (checkpoint of its last record, MLflow KILLED), then its resume
    ends on the uninterrupted run's adapter and records, in the same MLflow run."""
    assert not (run_dir / ADAPTER).exists()
    written = read_results(run_dir)[-1]["generation"]
    saved = [g for g, _ in checkpoints(run_dir / "checkpoints")]
    # the last finished generation (its record may be written just before its checkpoint)
    assert 1 <= written < 20 and len(saved) == 1 and written - 1 <= saved[0] <= written, saved
    run = mlflow_run(store, run_dir)
    assert run.info.status == "KILLED"

    proc = run_cli([f"resume={run_dir}"], timeout=180, env={"MLFLOW_TRACKING_URI": store})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"at generation {saved[0]}" in proc.stdout + proc.stderr
    assert (run_dir / ADAPTER).read_bytes() == (uninterrupted / ADAPTER).read_bytes()
    assert without_times(read_results(run_dir)) == without_times(read_results(uninterrupted))
    resumed = mlflow_run(store, run_dir)
    assert resumed.info.run_id == run.info.run_id and resumed.info.status == "FINISHED"
    client = MlflowClient(store)
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/fitness_mean")]
    assert sorted(steps) == list(range(1, 41))


def test_sigterm_checkpoints_kills_the_mlflow_run_and_resumes_identically(
    uninterrupted: Path, tmp_path: Path
) -> None:
    run_dir, store = tmp_path / "run", f"sqlite:///{tmp_path / 'mlflow.db'}"
    cmd = [sys.executable, "-m", "evolm", *ARGS, f"hydra.run.dir={run_dir}"]
    returncode, proc_out = terminate_after_first_generation(cmd, run_dir, store)
    assert returncode == 143  # 128 + SIGTERM, what a shell reports for it
    assert f"run stopped by SIGTERM; continue it: python -m evolm resume={run_dir}" in proc_out
    assert "Traceback" not in proc_out
    check_stopped_and_resume(run_dir, store, uninterrupted)


@pytest.mark.slow
def test_sigterm_to_torchrun_stops_both_ranks_cleanly(uninterrupted: Path, tmp_path: Path) -> None:
    """torchrun forwards SIGTERM to its 2 ranks: rank 0 checkpoints and ends the MLflow run as
    KILLED, both log the resume command, nothing waits for torchrun's SIGKILL (30 s later); a
    one-process resume ends on the uninterrupted run's bytes."""
    run_dir, store = tmp_path / "run", f"sqlite:///{tmp_path / 'mlflow.db'}"
    port = free_port()
    cmd = [
        *(sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"),
        *("--master_addr=127.0.0.1", f"--master_port={port}", "-m", "evolm"),
        *ARGS,
        f"hydra.run.dir={run_dir}",
    ]
    start = time.monotonic()
    _, out = terminate_after_first_generation(cmd, run_dir, store)  # torchrun's code: 1
    assert time.monotonic() - start < 60
    assert "SIGKILL" not in out, out[-3000:]
    stopped = f"run stopped by SIGTERM; continue it: python -m evolm resume={run_dir}"
    for log in (run_dir / "__main__.log", run_dir / "rank1.log"):
        assert stopped in log.read_text(), log
    check_stopped_and_resume(run_dir, store, uninterrupted)


# -- in process: the handler and deferred blocks -------------------------------------------


@pytest.fixture
def handlers() -> Any:
    """evolm's handlers installed in this (pytest's) process, pytest's restored after."""
    saved = {s: signal.getsignal(s) for s in interrupt.SIGNALS}
    interrupt.install()
    yield
    interrupt.uninstall()
    assert {s: signal.getsignal(s) for s in interrupt.SIGNALS} == saved
    assert interrupt.received() is None


def test_sigterm_inside_an_mlflow_store_call_still_ends_the_run_killed(
    handlers: None, tmp_path: Path
) -> None:
    """SIGTERM while a metrics batch is inside its sqlite transaction: the call completes, the
    signal comes out right after it, and the run ends KILLED at once. Before (the signal raised
    inside SQLAlchemy): the half-done transaction kept the store's write lock, the KILLED update
    waited for sqlite's busy timeout (40 s, past torchrun's SIGKILL) and the run stayed
    RUNNING."""
    logger = MLflowLogger(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    layout = LoraLayout(targets=(), rank=1, alpha=1.0, num_layers=1)
    ctx = RunContext(tmp_path, 5, layout, "base", config={"seed": 0})
    state = ESState(mean=[torch.zeros(2)], seed=0, generation=0)
    logger.on_run_start(ctx, state)
    sent: list[str] = []

    def signal_mid_transaction(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("SELECT runs") and not sent:
            sent.append(statement)
            os.kill(os.getpid(), signal.SIGTERM)

    event.listen(Engine, "after_cursor_execute", signal_mid_transaction)
    try:
        with pytest.raises(interrupt.Interrupted) as stopped:
            logger.on_generation_end(ctx, generation_record(1, fitness_mean=0.5), state)
    finally:
        event.remove(Engine, "after_cursor_execute", signal_mid_transaction)
    assert sent, "the signal was not sent inside the store call"
    start = time.monotonic()
    logger.on_run_error(ctx, stopped.value)
    assert time.monotonic() - start < 5
    client = MlflowClient(logger.tracking_uri)
    assert client.get_run(logger.run_id or "").info.status == "KILLED"
    [metric] = client.get_metric_history(logger.run_id or "", "train/fitness_mean")
    assert metric.value == 0.5  # the batch under way was written whole


def test_checkpointer_saves_the_last_finished_generation_on_a_stop_only(tmp_path: Path) -> None:
    """In process: generations 1-3 of a run checkpointing every 10; an error saves nothing, a
    stop saves generation 3 with its records and the task state of generation 3 (not of the
    generation under way when the signal came)."""
    task = Scorer(lambda_init=2.0)
    layout = LoraLayout(targets=(), rank=1, alpha=1.0, num_layers=1)
    ctx = RunContext(tmp_path, 40, layout, "base", stateful={"task": task})
    saver = Checkpointer(every=10)
    saver.on_run_start(ctx, ESState(mean=[torch.zeros(2)], seed=0, generation=0))
    for g in range(1, 4):
        saver.on_generation_end(ctx, generation_record(g), ESState([torch.full((2,), g)], 0, g))
    task.log_lambda = 9.0  # generation 4, under way
    saver.on_run_error(ctx, RuntimeError("a real failure"))
    assert checkpoints(tmp_path / "checkpoints") == []
    saver.on_run_error(ctx, interrupt.Interrupted(signal.SIGTERM))
    found = latest_checkpoint(tmp_path / "checkpoints")
    assert found is not None and found.generation == 3
    assert [r["generation"] for r in found.records] == [1, 2, 3]
    assert found.state["task"]["log_lambda"] == pytest.approx(math.log(2.0))


def test_a_stop_while_a_generation_ends_saves_that_generation(
    handlers: None, tmp_path: Path
) -> None:
    """SIGTERM after the results writer took generation 1 and before the checkpointer did (CI
    hit it under load): the generation ends whole, then the stop saves it, as the results say."""
    layout = LoraLayout(targets=(), rank=1, alpha=1.0, num_layers=1)
    ctx = RunContext(tmp_path, 40, layout, "base")
    saver, seen = Checkpointer(every=10), []

    class Writer(Callback):
        def on_generation_end(self, ctx: RunContext, record: Any, state: ESState) -> None:
            seen.append(record.generation)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)  # the handler runs here

    loop = SimpleNamespace(callbacks=[Writer(), saver])
    saver.on_run_start(ctx, ESState(mean=[torch.zeros(2)], seed=0, generation=0))
    with pytest.raises(interrupt.Interrupted) as stopped:
        ESLoop._emit(loop, ctx, generation_record(1), ESState([torch.ones(2)], 0, 1))  # type: ignore[arg-type]
    saver.on_run_error(ctx, stopped.value)
    found = latest_checkpoint(tmp_path / "checkpoints")
    assert seen == [1] and found is not None and found.generation == 1


def test_a_signal_in_a_deferred_block_is_raised_when_it_ends(handlers: None) -> None:
    done = []
    with pytest.raises(interrupt.Interrupted) as raised, interrupt.deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.01)  # the handler runs here
        done.append("the whole block")
    assert done == ["the whole block"] and raised.value.exit_code == 143
    # a rank whose collective failed because another rank stopped: interrupted, not failed
    assert interrupt.interruption(RuntimeError("connection reset by peer")) is not None
    os.kill(os.getpid(), signal.SIGTERM)  # while stopping: logged, ignored
    time.sleep(0.01)
