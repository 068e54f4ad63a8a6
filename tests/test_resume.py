"""Checkpoints and exact resume: a run SIGKILLed mid-generation and resumed ends bit-identical to
an uninterrupted one; unusable checkpoints are skipped; only the newest N are kept."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from mlflow import MlflowClient

from evolm import metrics as M
from evolm.app.resume import extending
from evolm.callbacks import RunContext
from evolm.callbacks.checkpoint import Checkpointer
from evolm.checkpoint import checkpoints, latest_checkpoint, save_checkpoint
from evolm.es import ES, ESState
from evolm.lora import LoraLayout
from evolm.task.scorer import Scorer
from tests.helpers import REPO, compose_config, generation_record, read_results, run_cli

GENERATIONS = 24
ARGS = [
    f"generations={GENERATIONS}",
    "eval_every=4",
    "es.population_size=6",
    "task.max_new_tokens=12",
    "callbacks.checkpoint.every=2",
    "callbacks.checkpoint.keep=2",
]
ADAPTER = Path("adapter") / "adapter_model.safetensors"


def without_times(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


def without_mean(record: dict[str, Any]) -> dict[str, Any]:
    """A record without its times and the mean's training numbers (train_mean)."""
    mean = ("time/", "train/mean/", M.MEMBER_GAP)
    return {k: v for k, v in record.items() if not k.startswith(mean)}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: str) -> Path:
    run_dir = tmp_path_factory.mktemp("resume") / "uninterrupted"
    proc = run_cli(
        [*ARGS, f"hydra.run.dir={run_dir}"], timeout=120, fresh=True
    )  # another hash seed than the resumes'
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def kill_mid_generation(run_dir: Path, generation_s: float) -> None:
    """Start the run, wait for its first checkpoint, SIGKILL it a random part of a generation
    later (seeded, so the test is repeatable)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    cmd = [sys.executable, "-m", "evolm", *ARGS, f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        first = run_dir / "checkpoints" / "gen-000002.pt.sha256"  # written last
        deadline = time.monotonic() + 90
        while not first.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.002)
        time.sleep(random.Random(0).random() * generation_s)
        assert proc.poll() is None, "the run ended before it could be killed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (run_dir / ADAPTER).exists()


@pytest.mark.slow  # make test-all (CI: test_interrupt resumes a SIGTERM-ed run identically)
def test_killed_run_resumes_bit_identical(uninterrupted: Path, tmp_path: Path) -> None:
    expected = read_results(uninterrupted)
    assert [g for g, _ in checkpoints(uninterrupted / "checkpoints")] == [22, 24]  # keep=2
    run_dir = tmp_path / "killed"
    seconds = [r["time/generation_s"] for r in expected if "time/generation_s" in r]
    kill_mid_generation(run_dir, sum(seconds) / len(seconds))
    killed_at = len(read_results(run_dir))

    proc = run_cli([f"resume={run_dir}"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming" in proc.stdout + proc.stderr
    assert (run_dir / ADAPTER).read_bytes() == (uninterrupted / ADAPTER).read_bytes()
    assert without_times(read_results(run_dir)) == without_times(expected)
    assert (run_dir / ".hydra" / "resume" / "overrides.yaml").is_file()  # the first kept

    # One MLflow run, continued: every generation once, finished.
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    [run] = client.search_runs(
        [client.get_experiment_by_name("evolm").experiment_id],  # type: ignore[union-attr]
        filter_string=f"params.output_dir = '{run_dir}'",
    )
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/fitness_mean")]
    assert sorted(steps) == list(range(1, GENERATIONS + 1)), f"killed after {killed_at} records"
    assert run.info.status == "FINISHED"


@pytest.mark.slow  # make test-all
def test_unusable_checkpoint_falls_back_to_the_previous(
    uninterrupted: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "copy"
    shutil.copytree(uninterrupted, run_dir)  # a moved run resumes where it is now
    newest = run_dir / "checkpoints" / "gen-000024.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated
    shutil.rmtree(run_dir / "adapter")
    proc = run_cli([f"resume={run_dir}"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert f"checkpoint {newest} is unusable" in out and "truncated or corrupt" in out
    assert "resuming" in out and "at generation 22" in out
    assert (run_dir / ADAPTER).read_bytes() == (uninterrupted / ADAPTER).read_bytes()
    assert without_times(read_results(run_dir)) == without_times(read_results(uninterrupted))

    rejected = run_cli([f"resume={run_dir}", "es.sigma=0.1"], timeout=120)
    assert rejected.returncode == 2
    assert "resume: ['es.sigma=0.1'] would change the run" in rejected.stdout + rejected.stderr


# -- a resume that would mix two runs is refused ----------------------------------------------


@pytest.fixture(scope="module")
def fast_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: str) -> Path:
    """A finished 3-generation run (seed 0, population 4, rank 4) with its last checkpoint."""
    run_dir = tmp_path_factory.mktemp("fast") / "run"
    proc = run_cli(["debug=fast", "logger=none", f"hydra.run.dir={run_dir}"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def run_files(run_dir: Path) -> dict[str, bytes]:
    """The bytes of the run's files but Hydra's (its log and ``.hydra/``: every start writes)."""
    files = [f for f in sorted(run_dir.rglob("*")) if f.is_file() and f.suffix != ".log"]
    return {str(f): f.read_bytes() for f in files if ".hydra" not in f.parts}


def copy_run(run_dir: Path, tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A copy of the run, and the bytes of its files (to check that a refusal touched none)."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    return copy, run_files(copy)


def assert_untouched(run_dir: Path, before: dict[str, bytes]) -> None:
    assert run_files(run_dir) == before


def test_a_run_stopped_by_its_time_budget_is_extended_by_a_resume(
    fast_run: Path, tmp_path: Path
) -> None:
    """``time_budget_s`` stops the run after generation 1 and checkpoints it there; a resume
    that raises the budget (a key a resume may change) runs generations 2-3 and ends as the
    uninterrupted run did, and the run's config.yaml keeps the new budget."""
    run_dir = tmp_path / "budget"
    args = ["debug=fast", "logger=none", f"hydra.run.dir={run_dir}", "time_budget_s=0.001"]
    first = run_cli(args, timeout=120)
    assert first.returncode == 0, first.stderr[-3000:]
    assert read_results(run_dir)[-1]["generation"] == 1
    assert (run_dir / "checkpoints" / "gen-000001.pt").is_file()
    resumed = run_cli([f"resume={run_dir}", "time_budget_s=1000"], timeout=120)
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    assert "resume: time_budget_s 0.001 -> 1000" in out and "at generation 1" in out
    assert without_times(read_results(run_dir)) == without_times(read_results(fast_run))
    assert (run_dir / ADAPTER).read_bytes() == (fast_run / ADAPTER).read_bytes()
    assert "time_budget_s: 1000" in (run_dir / "config.yaml").read_text()


def test_a_run_from_before_train_mean_resumes_with_it_on(fast_run: Path, tmp_path: Path) -> None:
    """A run whose config.yaml has no ``train_mean`` and whose records have no ``train/mean/*``
    (written as before the key, here with ``train_mean=false``) resumes with it on, and ends
    as the uninterrupted run (train_mean on) did: the mean's rows change nothing of the ES."""
    run_dir = tmp_path / "old"
    args = ["debug=fast", "logger=none", f"hydra.run.dir={run_dir}", "time_budget_s=0.001"]
    first = run_cli([*args, "train_mean=false"], timeout=120)
    assert first.returncode == 0, first.stderr[-3000:]
    config = run_dir / "config.yaml"
    old = [line for line in config.read_text().splitlines() if not line.startswith("train_mean")]
    config.write_text("\n".join(old) + "\n")
    resumed = run_cli([f"resume={run_dir}", "time_budget_s=1000"], timeout=120)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    records, expected = read_results(run_dir), read_results(fast_run)
    assert [M.TRAIN_MEAN_REWARD in r for r in records] == [False, False, True, True]
    assert without_times(records[2:]) == without_times(expected[2:])
    assert [without_mean(r) for r in records] == [without_mean(r) for r in expected]
    assert (run_dir / ADAPTER).read_bytes() == (fast_run / ADAPTER).read_bytes()
    assert extending(["train_mean=false"]) == ["train_mean"]  # a resume may also turn it off


@pytest.mark.parametrize(
    "override",
    [
        "seed=3",
        pytest.param("es.population_size=2", marks=pytest.mark.slow),  # make test-all
        pytest.param("lora.rank=2", marks=pytest.mark.slow),
    ],
)
def test_resume_with_another_seed_population_or_rank_is_refused(
    fast_run: Path, tmp_path: Path, override: str
) -> None:
    run_dir, before = copy_run(fast_run, tmp_path)
    proc = run_cli([f"resume={run_dir}", override, "logger=none"], timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert f"resume: ['{override}', 'logger=none'] would change the run" in out
    assert_untouched(run_dir, before)


@pytest.mark.parametrize(
    ("line", "edited", "named"),
    [
        ("seed: 0", "seed: 3", "seed=0 (config.yaml: 3)"),
        pytest.param(
            "  population_size: 4",
            "  population_size: 2",
            "es.population_size=4 (config.yaml: 2)",
            marks=pytest.mark.slow,  # make test-all
        ),
        ("  rank: 4", "  rank: 2", "lora.rank=4 (config.yaml: 2)"),
    ],
)
def test_checkpoint_of_another_configuration_is_refused(
    fast_run: Path, tmp_path: Path, line: str, edited: str, named: str
) -> None:
    """The run's config.yaml no longer matches its checkpoint (edited, or the checkpoint is
    another run's): refused before the model loads, naming the values, nothing written (before:
    another seed or population continued silently as a mix of two runs)."""
    run_dir, _ = copy_run(fast_run, tmp_path)
    config = run_dir / "config.yaml"
    text = config.read_text()
    assert f"\n{line}\n" in text
    config.write_text(text.replace(f"\n{line}\n", f"\n{edited}\n", 1))
    before = run_files(run_dir)
    proc = run_cli([f"resume={run_dir}"], timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert f"resume: checkpoint {run_dir}/checkpoints/gen-000003.pt was written by a run " in out
    assert named in out and "would mix two runs" in out
    assert "ES over" not in out  # refused before the model and engine
    assert_untouched(run_dir, before)


def test_checkpoint_without_its_config_is_checked_on_its_seed(
    fast_run: Path, tmp_path: Path
) -> None:
    """A checkpoint written before checkpoints recorded their config: its ES seed is checked."""
    run_dir, _ = copy_run(fast_run, tmp_path)
    found = latest_checkpoint(run_dir / "checkpoints")
    assert found is not None and found.run["es.population_size"] == 4
    es = ESState.from_state_dict({**found.es, "seed": 5})
    save_checkpoint(run_dir / "checkpoints", es, found.records, found.state)  # no run identity
    proc = run_cli([f"resume={run_dir}"], timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "was written by a run with seed=5 (config.yaml: 0)" in out


# -- the checkpoint files, in process ----------------------------------------------------


def state(generation: int) -> ESState:
    return ESState(mean=[torch.full((2, 3), float(generation))], seed=7, generation=generation)


def test_corrupt_or_unfinished_checkpoints_are_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for g in (2, 4, 6, 8):
        save_checkpoint(tmp_path, state(g), [{"generation": g}], {"task": {"log_lambda": 0.5}})
    flipped = tmp_path / "gen-000008.pt"
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one corrupt byte in the middle: torch.load may not notice
    flipped.write_bytes(bytes(data))
    (tmp_path / "gen-000006.pt.sha256").unlink()  # killed between the file and its digest
    (tmp_path / "gen-000004.pt.sha256").write_text("0" * 64 + "  gen-000004.pt\n")
    with caplog.at_level(logging.WARNING):
        found = latest_checkpoint(tmp_path)
    assert found is not None and found.generation == 2
    assert found.records == [{"generation": 2}] and found.state == {"task": {"log_lambda": 0.5}}
    assert torch.equal(ESState.from_state_dict(found.es).mean[0], state(2).mean[0])
    for g, why in ((8, "truncated or corrupt"), (6, "is missing"), (4, "truncated or corrupt")):
        assert f"gen-00000{g}.pt is unusable" in caplog.text and why in caplog.text


def test_checkpointer_every_keep_and_task_state(tmp_path: Path) -> None:
    scorer = Scorer(lambda_init=2.0)
    layout = LoraLayout(targets=(), rank=1, alpha=1.0, num_layers=1)
    ctx = RunContext(tmp_path, 7, layout, "base", stateful={"task": scorer})
    saver = Checkpointer(every=3, keep=2)
    saver.on_run_start(ctx, state(0))
    for g in range(1, 8):
        saver.on_generation_end(ctx, generation_record(g), state(g))
    assert [g for g, _ in checkpoints(tmp_path / "checkpoints")] == [6, 7]  # every 3 + the last
    found = latest_checkpoint(tmp_path / "checkpoints")
    assert found is not None and [r["generation"] for r in found.records] == list(range(1, 8))
    restored = Scorer()
    restored.load_state_dict(found.state["task"])
    assert restored.lambda_ == pytest.approx(2.0)


def test_adam_state_continues_exactly(tmp_path: Path) -> None:
    """ES state (mean, Adam moments, step) through a checkpoint: the continuation is identical."""
    es = ES(
        population_size=6,
        sigma=0.1,
        alpha=0.05,
        antithetic=True,
        shaping="centered_ranks",
        update="openai",
        optimizer="adam",
    )
    fitness = torch.Generator().manual_seed(1)

    def advance(s: ESState, n: int) -> ESState:
        for _ in range(n):
            pop = es.ask(s)
            f = sum(x.flatten(1).sum(1) for x in es.sample(s, pop)) + torch.rand(
                6, generator=fitness
            )
            s, _ = es.tell(s, pop, f)
        return s

    mid = advance(es.init([torch.zeros(3, 4), torch.ones(2)], seed=5), 3)
    save_checkpoint(tmp_path, mid, [], {})
    found = latest_checkpoint(tmp_path)
    assert found is not None
    fitness_state = fitness.get_state()
    straight = advance(mid, 3)
    fitness.set_state(fitness_state)
    resumed = advance(ESState.from_state_dict(found.es), 3)
    assert all(torch.equal(a, b) for a, b in zip(straight.mean, resumed.mean, strict=True))
    assert resumed.generation == 6 and resumed.opt["step"] == 6


# What conf/model/tiny.yaml gives without task=countdown: task=countdown on the default tiny
# model (already built), not the countdown warm-up's (minutes to build).
COUNTDOWN_ON_TINY = [
    "task=countdown",
    "model.warmup_steps=200",
    "model.countdown_share=0",
    "model.countdown_untagged=0",
    "model.max_position_embeddings=1024",
]


COUNTDOWN_RUN = [
    *COUNTDOWN_ON_TINY,
    *("task.train_size=20", "task.samples_per_generation=4", "task.eval_samples=4"),
    *("generations=4", "eval_every=2", "es.population_size=4", "task.max_new_tokens=8"),
    "callbacks.checkpoint.every=1",
]


def write_puzzles(path: Path, seed: int) -> None:
    from evolm.task.countdown.data import generate_puzzles

    records = [{"numbers": r["numbers"], "target": r["target"]} for r in generate_puzzles(40, seed)]
    path.write_text(json.dumps(records))


def test_resume_on_other_data_is_refused_unless_asked_then_recorded(
    tmp_path: Path,
    tiny_model_dir: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 40 item 7: a countdown run on ``task.data_file=x.json`` stopped, ``x.json``
    replaced by other records: the resume is refused before the model loads, naming the key
    and the fix (before: it trained on the new records without a word). With
    ``resume_on_new_data=true`` it goes on, warns, and records the change in its checkpoints
    and its MLflow run. (In process: the run stops on an error in generation 3.)"""
    from evolm.app import train
    from evolm.engine.local import LocalEngine
    from evolm.errors import ConfigError

    data, run_dir = tmp_path / "x.json", tmp_path / "run"
    write_puzzles(data, 1)
    tell, told = ES.tell, [0]

    def stop_in_generation_3(self: ES, *args: Any, **kwargs: Any) -> Any:
        told[0] += 1
        if told[0] == 3:
            raise RuntimeError("stopped in generation 3")
        return tell(self, *args, **kwargs)

    monkeypatch.setattr(ES, "tell", stop_in_generation_3)
    with pytest.raises(RuntimeError, match="stopped in generation 3"):
        train(compose_config([*COUNTDOWN_RUN, f"task.data_file={data}", f"output_dir={run_dir}"]))
    monkeypatch.undo()
    write_puzzles(data, 2)  # 40 other puzzles

    loads = LocalEngine.loads
    with pytest.raises(ConfigError) as refused:
        train(compose_config([f"resume={run_dir}"]))
    checkpoint = run_dir / "checkpoints" / "gen-000002.pt"
    assert str(refused.value).startswith(
        f"task.data_file: the prompts task reads (task.data_file={data}) differ from those "
        f"checkpoint {checkpoint} was trained on (data fingerprint "
    )
    assert "continue this run on it anyway with resume_on_new_data=true" in str(refused.value)
    assert LocalEngine.loads == loads  # before the model loads

    train(compose_config([f"resume={run_dir}", "resume_on_new_data=true"]))
    assert "the run continues on it (resume_on_new_data=true)" in caplog.text
    final = latest_checkpoint(run_dir / "checkpoints")
    assert final is not None and final.generation == 4
    [change] = final.data_changes
    assert change["generation"] == 2 and change["part"] == "task"
    assert change["now"] == final.data["task"] != change["was"]
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    [run] = client.search_runs(
        [client.get_experiment_by_name("evolm").experiment_id],  # type: ignore[union-attr]
        filter_string=f"params.output_dir = '{run_dir}'",
    )
    tag = run.data.tags["evolm.data_changed"]
    assert tag == f"generation 2: task {change['was'][:12]} -> {change['now'][:12]}"
