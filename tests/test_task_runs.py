"""End to end: ES runs of ``task=countdown`` and ``task=scorer`` through the real CLI on the
tiny model (subprocesses; the scorer run talks to a real scorer server subprocess)."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import StartServer
from tests.helpers import COUNTDOWN_MODEL, read_results, run_cli
from tests.test_task_countdown import overlapping_data

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "tasks.md"
SMALL_RUN = [
    "generations=2",
    "eval_every=1",
    "es.population_size=4",
    "task.max_new_tokens=16",
    "task.samples_per_generation=2",
]


def run_said(tmp_path: Path, *overrides: str, cwd: Path = REPO) -> tuple[str, list[dict[str, Any]]]:
    """``python -m evolm OVERRIDES`` into ``tmp_path/run``; returns what it printed (stdout and
    stderr) and the records of results.jsonl."""
    out = tmp_path / "run"
    proc = run_cli([*overrides, f"output_dir={out}", f"hydra.run.dir={out}"], cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout + proc.stderr, read_results(out)


def run(tmp_path: Path, *overrides: str, cwd: Path = REPO) -> list[dict[str, Any]]:
    """:func:`run_said`'s records alone."""
    return run_said(tmp_path, *overrides, cwd=cwd)[1]


def test_countdown_run(tmp_path: Path, countdown_model_dir: str) -> None:
    free = [  # an extra eval set, as issue 36's runs hold their template-free held-out sets
        "+task@extra_evals.free=countdown",
        "extra_evals.free.generator=uniform",
        "extra_evals.free.eval_samples=3",
        "extra_evals.free.max_new_tokens=16",
    ]
    records = run(
        tmp_path, "task=countdown", *COUNTDOWN_MODEL, *SMALL_RUN, "task.eval_samples=4", *free
    )
    assert [r["generation"] for r in records] == [0, 1, 2]
    for key in ("reward", "format_reward", "answer_reward", "accuracy"):
        assert f"eval/{key}_mean" in records[0]
        assert all(f"eval/{key}_mean" in r for r in records[1:])
        # the mean reward of a generation is its fitness mean: not logged twice
        train_key = "train/fitness_mean" if key == "reward" else f"train/{key}_mean"
        assert all(train_key in r for r in records[1:])
    assert "train/reward_mean" not in records[1]
    assert 0.0 <= records[-1]["train/accuracy_mean"] <= 1.0
    assert records[0]["data/train_test_overlap"] == 0  # generated puzzles: none repeated
    # the shortcut figures (Countdown.summarize): the mean's as eval/, the population's as train/
    shortcut = ["shortcut_accuracy", "shortcut/sum", "template_solvable_share"]
    assert all(f"eval/{k}" in r for r in records for k in [*shortcut, "accuracy/n3"])
    assert all(f"train/{k}" in r for r in records[1:] for k in shortcut)
    # the first 4 held-out puzzles of the tree generator, seed 0: sums solve 2 of them
    assert records[0]["eval/shortcut/sum"] == 0.5
    # private scores ("_form", "_template_answer") are never logged: not as train/_form_mean,
    # eval/_form_mean, nor as the mean's train/mean/_form (train/mean/format_reward is public)
    assert not [k for r in records for k in r if "/_" in k or "__" in k]
    assert all("train/mean/format_reward" in r for r in records[1:])  # train_mean=true
    samples = sorted((tmp_path / "run" / "samples").glob("*.jsonl"))
    assert len(samples) == 3  # nor in the samples file of each eval
    for sample in samples:
        scores = json.loads(sample.read_text().splitlines()[0])["scores"]
        assert "accuracy" in scores and not [k for k in scores if k.startswith("_")]
    # the extra set's answers beside them, in samples/free/: its own puzzles, its own scores
    extra = sorted((tmp_path / "run" / "samples" / "free").glob("gen-*.jsonl"))
    assert [p.name for p in extra] == [p.name for p in samples]
    for path, own, record in zip(extra, samples, records, strict=True):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(lines) == 3 and {s["generation"] for s in lines} == {record["generation"]}
        own_prompts = {json.loads(line)["prompt"] for line in own.read_text().splitlines()}
        assert not own_prompts & {s["prompt"] for s in lines}
        solved = sum(s["scores"]["accuracy"] for s in lines) / 3
        assert solved == pytest.approx(record["eval/free/accuracy_mean"])


@pytest.mark.slow  # make test-all
def test_countdown_run_records_the_train_test_overlap(
    tmp_path: Path, countdown_model_dir: str
) -> None:
    data = overlapping_data(tmp_path / "cd.jsonl")
    overrides = [f"task.data_file={data}", "task.train_size=6", "callbacks.plot.min_interval_s=60"]
    out = tmp_path / "run"
    args = ["task=countdown", *COUNTDOWN_MODEL, *SMALL_RUN, *overrides, f"hydra.run.dir={out}"]
    proc = run_cli(args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "3 of the 4 eval puzzles are also training puzzles" in proc.stdout + proc.stderr
    records = read_results(out)
    assert records[0]["data/train_test_overlap"] == 3
    assert all("data/train_test_overlap" not in r for r in records[1:])


@pytest.mark.slow
def test_headline_countdown_command_learns(tmp_path: Path, countdown_demo_dir: str) -> None:
    """README's first countdown command, as typed (default budget: 40 generations of 16
    members on 16 puzzles, held-out reward on 32): the held-out reward and format rise, the
    accuracy does not fall.

    The countdown model is built the same on every x86-64 machine with AVX2 (float64 warm-up,
    fused AdamW, test_model.py), and the run gave the same adapter under AVX-512, AVX2 and
    plain CPU kernels. Its numbers moved with the model's build: reward 0.024 -> 0.120 (an
    early release), 0.033 -> 0.103 (MKL's AVX2 branch), 0.069 -> 0.112 with accuracy 1 of 32
    throughout (MKL's COMPATIBLE branch, on an Intel Xeon), now 0.118 -> 0.248, format 0.24 ->
    0.92, accuracy 3 -> 5 of 32 (the fused AdamW, on an AMD EPYC; told at generation 30): what
    it learns is the format (README). The assertion asks for format +0.25 and reward +0.03,
    and for the run to say that its held-out reward rose at a flat accuracy (the health
    monitor's ``accuracy_flat``)."""
    said, records = run_said(tmp_path, "task=countdown", "es.sigma=0.001")
    assert "THIS RUN IS GAMING ITS REWARD (eval/accuracy_mean)" in said, said[-4000:]
    evals = [r for r in records if "eval/reward_mean" in r]
    start, end = evals[0], evals[-1]
    assert end["generation"] == 40
    keys = ("eval/reward_mean", "eval/format_reward_mean", "eval/accuracy_mean")
    trace = [(r["generation"], *(round(r[k], 4) for k in keys)) for r in evals]
    assert end["eval/accuracy_mean"] >= start["eval/accuracy_mean"], trace
    assert end["eval/format_reward_mean"] >= start["eval/format_reward_mean"] + 0.25, trace
    assert end["eval/reward_mean"] >= start["eval/reward_mean"] + 0.03, trace


@pytest.mark.slow  # make test-all (CI: test_task_scorer against the real service)
def test_scorer_run(tmp_path: Path, tiny_model_dir: str, start_server: StartServer) -> None:
    scorer_url = start_server()
    records = run(
        tmp_path,
        "task=scorer",
        f"task.url={scorer_url}",
        "task.lambda_adapt=true",
        "task.lambda_lr=0.5",
        *SMALL_RUN,
    )
    assert [r["generation"] for r in records] == [0, 1, 2]
    train = records[1:]
    for key in ("scorer_reward", "cost"):
        assert all(f"train/{key}_mean" in r and f"eval/{key}_mean" in r for r in train)
    assert all("train/fitness_mean" in r and "eval/reward_mean" in r for r in train)
    lambdas = [r["train/lambda"] for r in train]
    costs = [r["train/cost_mean"] for r in train]
    expected = 1.0
    for cost, lam in zip(costs, lambdas, strict=True):  # ln(lambda) += 0.5 * (cost - 0)
        expected = min(expected * math.exp(0.5 * cost), 5.0)
        assert lam == pytest.approx(expected, rel=1e-6)


def test_own_task_from_docs(tmp_path: Path, tiny_model_dir: str) -> None:
    """The "Write your own task" example of docs/tasks.md, run exactly as the docs say."""
    section = DOCS.read_text().split("## Write your own task", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    yaml = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert code and yaml and len(code.group(1).splitlines()) < 20
    (tmp_path / "my_tasks.py").write_text(code.group(1))
    (tmp_path / "conf" / "task").mkdir(parents=True)
    (tmp_path / "conf" / "task" / "shout.yaml").write_text(yaml.group(1))
    command = re.search(r"```bash\n(python -m evolm .*?)```", section, re.DOTALL)
    assert command
    documented = shlex.split(command.group(1).replace("\\\n", " "))[3:]
    assert documented[:4] == [
        "--config-dir",
        "conf",
        "task=shout",
        "trusted_targets=[evolm.*,my_tasks.*]",
    ]
    overrides = [*documented, "generations=1", "es.population_size=4"]
    records = run(tmp_path, *overrides, cwd=tmp_path)
    assert [r["generation"] for r in records] == [0, 1]
    assert 0.0 <= records[-1]["train/fitness_mean"] <= 1.0
