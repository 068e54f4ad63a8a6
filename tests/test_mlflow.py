"""MLflow tracking: what a run leaves in the store (read back through MlflowClient), and that
a store that is down never costs the run its results."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from mlflow import MlflowClient
from omegaconf import OmegaConf

import evolm
from evolm.callbacks import GenerationRecord, RunContext
from evolm.callbacks.mlflow import MLflowLogger
from evolm.es import ESState
from evolm.lora import LoraLayout
from evolm.tracking.runinfo import flatten
from tests.conftest import SHORT_RUN
from tests.helpers import REPO, generation_record, read_results, run_cli

RECORD_KEYS = {
    "train/fitness_mean",
    "train/fitness_p20",
    "train/fitness_p80",
    "train/fitness_max",
    "eval/reward_mean",
    "es/update_norm",
    "time/generation_s",
    "time/eval_s",
}


def the_run(uri: str) -> Any:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("evolm")
    assert experiment is not None
    [run] = client.search_runs([experiment.experiment_id])
    return run


def test_run_params_and_every_generations_metrics(short_run: tuple[Path, str]) -> None:
    run_dir, uri = short_run
    run = the_run(uri)
    assert run.info.status == "FINISHED"
    config = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"))
    assert isinstance(config, dict)
    sigma, rank = config["es"]["sigma"], config["lora"]["rank"]
    assert run.info.run_name == f"conciseness-tiny-s{sigma}-r{rank}"
    assert run.data.params == flatten(config)  # type: ignore[arg-type]
    assert run.data.params["es.population_size"] == "4"
    records = read_results(run_dir)
    keys = {k for r in records for k in r} - {"generation"}
    assert keys >= RECORD_KEYS
    client = MlflowClient(uri)
    for key in keys:
        logged = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert logged == [(r["generation"], r[key]) for r in records if key in r], key
    assert [r["generation"] for r in records] == [0, 1, 2, 3, 4]


def test_run_tags_and_artifacts(short_run: tuple[Path, str], tmp_path: Path) -> None:
    run_dir, uri = short_run
    run = the_run(uri)
    tags = run.data.tags
    assert (tags["task"], tags["model"], tags["server"]) == ("conciseness", "tiny", "local")
    assert tags["evolm_version"] == evolm.__version__
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if head.returncode == 0:
        assert tags["git_commit"] == tags["mlflow.source.git.commit"] == head.stdout.strip()
    assert "mlflow.parentRunId" not in tags
    client = MlflowClient(uri)
    run_id = run.info.run_id
    top = {a.path for a in client.list_artifacts(run_id)}
    assert top == {"config.yaml", "results.jsonl", "figures", "samples", "adapter"}
    assert {a.path for a in client.list_artifacts(run_id, "figures")} == {"figures/evolution.png"}
    for name in (
        "adapter/adapter_model.safetensors",
        "adapter/adapter_config.json",
        "results.jsonl",
    ):
        local = client.download_artifacts(run_id, name, str(tmp_path))
        assert Path(local).read_bytes() == (run_dir / name).read_bytes(), name


def test_samples_of_the_mean_are_written_at_each_eval_and_uploaded(
    short_run: tuple[Path, str], tmp_path: Path
) -> None:
    """generations=4, eval_every=2: evals at 0, 2, 4; each file holds the first 4 eval prompts
    with what the mean answered and the reward of that answer."""
    run_dir, uri = short_run
    names = sorted(p.name for p in (run_dir / "samples").iterdir())
    assert names == ["gen-0.jsonl", "gen-2.jsonl", "gen-4.jsonl"]
    eval_file = REPO / "evolm" / "data" / "conciseness" / "eval.jsonl"
    references = [json.loads(line) for line in eval_file.read_text().splitlines()][:4]
    for name in names:
        lines = [json.loads(line) for line in (run_dir / "samples" / name).read_text().splitlines()]
        assert [s["prompt"] for s in lines] == [r["question"] for r in references]
        for s, ref in zip(lines, references, strict=True):
            assert s["scores"] == {"reward": -abs(len(s["completion"]) - len(ref["answer"]))}
    client = MlflowClient(uri)
    run_id = the_run(uri).info.run_id
    uploaded = {a.path for a in client.list_artifacts(run_id, "samples")}
    assert uploaded == {f"samples/{n}" for n in names}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is: nothing listens there


@pytest.mark.slow  # make test-all
def test_unreachable_store_never_costs_the_run(tmp_path: Path, tiny_model_dir: str) -> None:
    run_dir = tmp_path / "run"
    start = time.monotonic()
    proc = run_cli(
        [
            *SHORT_RUN,
            f"hydra.run.dir={run_dir}",
            f"logger.mlflow.tracking_uri=http://127.0.0.1:{closed_port()}",
            "logger.mlflow.retries=1",
            "logger.mlflow.backoff_s=0.05",
            "logger.mlflow.timeout_s=1",
        ],
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "MLflow: could not start the run" in out and "this run is NOT tracked" in out
    assert [r["generation"] for r in read_results(run_dir)] == [0, 1, 2, 3, 4]
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
    assert time.monotonic() - start < 60


# -- the logger alone, in process --------------------------------------------------------


def context(tmp_path: Path, history: list[dict[str, Any]] | None = None) -> RunContext:
    layout = LoraLayout(targets=(), rank=1, alpha=1.0, num_layers=1)
    return RunContext(tmp_path, 3, layout, "base", {"es": {"sigma": 0.1}}, history or [])


def record(g: int) -> GenerationRecord:
    return generation_record(g, fitness_mean=float(g), update_norm=math.nan)


STATE = ESState(mean=[torch.zeros(1)], seed=0)


def store_down(*args: Any, **kwargs: Any) -> None:
    raise ConnectionError("the store is down")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"


def test_metrics_that_fail_are_sent_later(
    store: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = store
    logger = MLflowLogger(uri, experiment_name="flaky", retries=0, artifacts=[])
    ctx = context(tmp_path)
    logger.on_run_start(ctx, STATE)
    assert logger.client is not None
    real = logger.client.log_batch
    logger.client.log_batch = store_down  # type: ignore[method-assign]
    logger.on_generation_end(ctx, record(1), STATE)
    logger.on_generation_end(ctx, record(2), STATE)
    per_record = len(record(1).as_record()) - 1  # every metric but the generation
    assert "could not log metrics" in caplog.text and len(logger.pending) == 2 * per_record
    logger.client.log_batch = real  # type: ignore[method-assign]  # the store is back
    logger.on_generation_end(ctx, record(3), STATE)
    logger.on_run_end(ctx, {}, STATE)
    assert not logger.pending
    history = MlflowClient(uri).get_metric_history(logger.run_id, "train/fitness_mean")
    assert sorted(m.step for m in history) == [1, 2, 3]


def test_child_run_and_resumed_run(store: str, tmp_path: Path) -> None:
    uri = store
    client = MlflowClient(uri)
    parent = client.create_run(client.create_experiment("sweep")).info.run_id
    first = MLflowLogger(uri, experiment_name="sweep", parent_run_id=parent, artifacts=[])
    first.on_run_start(context(tmp_path), STATE)
    for g in (1, 2):
        first.on_generation_end(context(tmp_path), record(g), STATE)
    checkpoint = first.state_dict()  # as a checkpoint at generation 1 would hold it
    run_id = checkpoint["run_id"]
    assert client.get_run(run_id).data.tags["mlflow.parentRunId"] == parent
    # The process dies; the run resumes from a checkpoint of generation 1 and redoes 2 and 3.
    second = MLflowLogger(uri, experiment_name="sweep", artifacts=[])
    second.load_state_dict(checkpoint)
    ctx = context(tmp_path, history=[record(1).as_record()])
    second.on_run_start(ctx, STATE)
    for g in (2, 3):
        second.on_generation_end(ctx, record(g), STATE)
    second.on_run_end(ctx, {}, STATE)
    assert second.run_id == run_id
    steps = [m.step for m in client.get_metric_history(run_id, "train/fitness_mean")]
    assert sorted(steps) == [1, 2, 3]  # generation 2, sent before the crash, is not repeated
    assert client.get_run(run_id).info.status == "FINISHED"


def test_a_run_ends_the_runs_of_dead_processes_as_killed(store: str, tmp_path: Path) -> None:
    """Issue 40 item 1: a process killed outright (SIGKILL) leaves its MLflow run RUNNING. The
    next run on the store ends as KILLED every RUNNING run whose run directory's lock nothing
    holds; a run whose lock is held (alive), whose directory has no lock (another host) or
    that has no run-directory tag (another tool) is left alone."""
    from filelock import FileLock

    from evolm.callbacks.mlflow import RUN_DIR_TAG

    client = MlflowClient(store)
    experiment = client.create_experiment("dead")
    dirs = {name: tmp_path / name for name in ("dead", "alive", "elsewhere")}
    for name, folder in dirs.items():
        folder.mkdir()
        if name != "elsewhere":
            (folder / ".lock").touch()
    runs = {
        name: client.create_run(experiment, tags={RUN_DIR_TAG: str(folder)}).info.run_id
        for name, folder in dirs.items()
    }
    runs["untagged"] = client.create_run(experiment).info.run_id
    held = FileLock(str(dirs["alive"] / ".lock"))
    held.acquire()  # as the running process holds it
    try:
        logger = MLflowLogger(store, experiment_name="dead", artifacts=[])
        ctx = context(tmp_path / "new")
        logger.on_run_start(ctx, STATE)
        logger.on_run_end(ctx, {}, STATE)
    finally:
        held.release()
    status = {name: client.get_run(run).info.status for name, run in runs.items()}
    assert status == {
        "dead": "KILLED",
        "alive": "RUNNING",
        "elsewhere": "RUNNING",
        "untagged": "RUNNING",
    }
    new = client.get_run(logger.run_id or "")
    assert new.data.tags[RUN_DIR_TAG] == str((tmp_path / "new").resolve())
