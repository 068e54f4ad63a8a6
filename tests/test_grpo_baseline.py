"""The GRPO baseline and the ES-vs-GRPO comparison (``baselines/``) on the countdown tiny model,
CPU: the exact commands ``python -m baselines.compare`` runs, two updates each, then its report.

Not a measurement: it checks that GRPO trains through TRL on evolm's task (its reward is the
task's, its LoRA moves), that both runs write the same ``eval/*`` keys from the same start, and
that the comparison draws its figure and table from the two run directories.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from baselines import compare, grpo, grpo_budget
from baselines.grpo_data import TaskReward, train_split
from baselines.runconfig import compose_run
from evolm import metrics as M
from evolm.errors import ConfigError
from evolm.loop import TrainClock
from evolm.task.countdown import Countdown
from evolm.task.countdown.reward import countdown_reward
from tests.helpers import COUNTDOWN_MODEL, REPO, read_results

SHARED = [  # evolm overrides both runs get: two updates, an eval after each
    "task=countdown",
    *COUNTDOWN_MODEL,
    "task.max_new_tokens=48",
    "task.eval_samples=12",
    "task.samples_per_generation=2",
    "es.population_size=4",
    "generations=2",
]
GRPO = ["grpo.num_generations=4", "grpo.micro_batch=8", "grpo.learning_rate=0.01"]
PAPER_FILE = REPO.parent / "shared/data/countdown/countdown.json"
ANSWER = "<think> 3 + 4 = 7 </think>\n<answer> 3 + 4 </answer>"


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory, countdown_model_dir: str) -> Path:
    """``<out>/es`` and ``<out>/grpo`` from compare's own command lines (ES in a subprocess,
    as compare runs it; GRPO in this process), then compare's report of them."""
    out = tmp_path_factory.mktemp("compare")
    settings, grpo_args, evolm_args = compare.split_args(
        [*SHARED, *GRPO, "budget_minutes=60", "eval_every_minutes=0.00001", f"out={out}"]
    )
    commands = compare.commands(settings, grpo_args, evolm_args, out)
    env_es = subprocess.run(commands["es"], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert env_es.returncode == 0, (env_es.stdout + env_es.stderr)[-3000:]
    assert grpo.main(commands["grpo"][3:]) == 0
    assert compare.main(["report_only=true", f"out={out}", *SHARED]) == 0
    return out


def test_grpo_trains_on_the_tasks_reward_and_moves_its_lora(compared: Path) -> None:
    records = read_results(compared / "grpo")
    assert [r["generation"] for r in records] == [0, 1, 2]
    for r in records[1:]:  # what TRL optimised is what evolm's task scored
        assert r["grpo/reward"] == pytest.approx(r[M.FITNESS_MEAN], abs=1e-6)
        assert r[M.train_score("format_reward")] > 0 and r["train/tokens"] > 0
        assert r[M.TRAIN_S] > 0 and M.EVAL_REWARD in r  # an eval at every mark
    weights = load_file(str(compared / "grpo" / "adapter" / "adapter_model.safetensors"))
    b = [w for k, w in weights.items() if "lora_B" in k]
    assert b and max(w.abs().max().item() for w in b) > 0  # peft starts B at 0


def test_both_runs_write_the_same_eval_keys_from_the_same_start(compared: Path) -> None:
    es, grpo_records = read_results(compared / "es"), read_results(compared / "grpo")
    keys = {k for k in es[0] if k.startswith("eval/")}
    assert {M.eval_score("accuracy"), "eval/accuracy_beyond_shortcuts", M.EVAL_KL_MEAN} <= keys
    assert {k for k in grpo_records[0] if k.startswith("eval/")} == keys
    for key in (M.EVAL_REWARD, M.eval_score("accuracy"), "eval/completion_tokens"):
        assert grpo_records[0][key] == es[0][key], key  # one model, one evaluator
    assert [r["generation"] for r in es if M.EVAL_REWARD in r] == [0, 1, 2]
    assert all(M.TRAIN_S in r for r in es[1:])
    for method in ("es", "grpo"):
        peak = json.loads((compared / method / "peak_memory.json").read_text())
        assert peak["device"] == "cpu" and peak["peak_gb"] > 0


def test_both_runs_write_the_answers_of_each_evaluation_alike(compared: Path) -> None:
    """``samples/gen-<n>.jsonl``: the same prompts, and at the start (one model) the same
    completions and scores, for ES and GRPO: the answers of both can be read side by side."""
    es, grpo_dir = compared / "es" / "samples", compared / "grpo" / "samples"
    names = sorted(p.name for p in es.glob("gen-*.jsonl"))
    assert names and sorted(p.name for p in grpo_dir.glob("gen-*.jsonl")) == names
    first = [
        [json.loads(x) for x in (d / names[0]).read_text().splitlines()] for d in (es, grpo_dir)
    ]
    assert first[0] == first[1] and first[0][0]["completion"] and "scores" in first[0][0]


def test_compare_draws_its_figure_and_table_from_both_runs(compared: Path) -> None:
    assert (compared / "comparison.png").read_bytes()[:4] == b"\x89PNG"
    table = (compared / "comparison.md").read_text()
    assert "| | ES | GRPO |" in table and "accuracy beyond shortcuts" not in table.split("|")[0]
    summary = {s["method"]: s for s in json.loads((compared / "comparison.json").read_text())}
    assert summary.keys() == {"es", "grpo"}
    assert summary["es"]["updates"] == summary["grpo"]["updates"] == 2
    assert summary["es"]["tokens"] > 0 and summary["grpo"]["tokens"] > 0
    assert "final eval/accuracy_beyond_shortcuts" in summary["grpo"]


def test_the_reward_is_the_tasks_on_the_text_up_to_the_stop_string() -> None:
    task = Countdown(generate_count=40, train_size=20, stop=["</answer>"])
    example = task.train[0]
    numbers, target = example.reference["numbers"], example.reference["target"]
    texts = [ANSWER, ANSWER + " and then <answer> 1 </answer>", "no answer"]
    reward = TaskReward(task, task.train, eos_ids=[0], max_tokens=4)
    got = reward([""] * 3, texts, [[5, 6, 0], [5, 6, 7, 8], [5]], example=[0, 0, 0])
    want = [countdown_reward(ANSWER, numbers, target)["reward"]] * 2
    assert got == [*want, countdown_reward("no answer", numbers, target)["reward"]]
    stats = reward.drain()  # EOS not counted; the 4-token row ran out of budget
    assert (
        stats["train/tokens"] == 2 + 4 + 1 and stats[M.train_diagnostic("truncated_share")] == 1 / 3
    )
    assert reward.drain() == {}


def test_the_budget_stops_grpo_after_the_step_that_reaches_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(grpo_budget, "adapter_tensors", lambda model, layout: [torch.zeros(1)])
    evals: list[int] = []
    callback = grpo_budget.BudgetCallback(
        TrainClock(budget_s=1e-9), lambda t, step: evals.append(step) or {M.EVAL_REWARD: 0.5}, None,
        TaskReward(Countdown(generate_count=40, train_size=20), [], [], 8), tmp_path, 100,
    )  # fmt: skip
    control = SimpleNamespace(should_training_stop=False)
    callback.on_train_begin(None, None, control, model=None)
    callback.on_step_end(None, SimpleNamespace(global_step=1), control, model=None)
    callback.on_train_end(None, None, control)
    assert control.should_training_stop and evals == [0, 1]  # the start's and the last step's
    assert [r["generation"] for r in read_results(tmp_path)] == [0, 1]


@pytest.mark.parametrize("spreads", [(1.0, 1.0), (1.0, 0.5)])
def test_a_step_whose_groups_all_tie_says_it_learned_nothing(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    spreads: tuple[float, float],
) -> None:
    """Session 32's GRPO smoke run (seed 0): its first 8 rollouts all scored 0.01, so the step
    had no gradient and the adapter stayed at 0, and nothing said so. Each step TRL logs with
    ``frac_reward_zero_std`` 1 is named, with the advice once; a run where every step tied
    ends with ``THIS GRPO RUN IS NOT LEARNING``."""
    monkeypatch.setattr(grpo_budget, "adapter_tensors", lambda model, layout: [torch.zeros(1)])
    callback = grpo_budget.BudgetCallback(
        TrainClock(budget_s=1e9), lambda t, step: {M.EVAL_REWARD: 0.5}, None,
        TaskReward(Countdown(generate_count=40, train_size=20), [], [], 8), tmp_path, 100,
    )  # fmt: skip
    control = SimpleNamespace(should_training_stop=False)
    callback.on_train_begin(None, None, control, model=None)
    for step, tied in enumerate(spreads, start=1):
        callback.on_step_end(None, SimpleNamespace(global_step=step), control, model=None)
        callback.on_log(None, None, control, logs={"loss": 0.0, "frac_reward_zero_std": tied})
    callback.on_train_end(None, None, control)
    said = caplog.text
    assert "GRPO step 1 learned nothing: every group's completions scored alike" in said
    assert said.count("raise grpo.temperature or grpo.num_generations") == 1 + (spreads[1] == 1)
    assert ("GRPO step 2 learned nothing" in said) == (spreads[1] == 1)
    headline = "THIS GRPO RUN IS NOT LEARNING: in all 2 steps every group's completions"
    assert (headline in said) == (spreads[1] == 1)
    assert [r["grpo/frac_reward_zero_std"] for r in read_results(tmp_path)[1:]] == list(spreads)


def test_devices_run_the_methods_side_by_side_one_gpu_each(tmp_path: Path) -> None:
    """``devices=0,1``: both commands start before either ends (the ES stand-in waits for a
    file the GRPO one writes), each with its own ``CUDA_VISIBLE_DEVICES``; a failed method is
    an error quoting its log."""
    flag = tmp_path / "grpo-started"
    wait = (
        "import os, pathlib, time\n"
        f"p = pathlib.Path({str(flag)!r})\n"
        "for _ in range(600):\n"
        "    if p.exists(): break\n"
        "    time.sleep(0.05)\n"
        "else: raise SystemExit('the other method never started')\n"
        "print('es on', os.environ['CUDA_VISIBLE_DEVICES'])"
    )
    touch = (
        f"import os, pathlib; pathlib.Path({str(flag)!r}).touch(); "
        "print('grpo on', os.environ['CUDA_VISIBLE_DEVICES'])"
    )
    commands = {"es": [sys.executable, "-c", wait], "grpo": [sys.executable, "-c", touch]}
    compare.run_methods(commands, tmp_path, ["3", "5"])
    assert (tmp_path / "es.log").read_text().strip() == "es on 3"
    assert (tmp_path / "grpo.log").read_text().strip() == "grpo on 5"
    failing = {"es": [sys.executable, "-c", "raise SystemExit('out of memory')"]}
    with pytest.raises(RuntimeError, match=r"es exited 1(.|\n)*out of memory"):
        compare.run_methods(failing, tmp_path, [])


@pytest.mark.parametrize("devices", ["0", "0,x", "0,1,2"])
def test_devices_must_name_one_gpu_per_method(devices: str) -> None:
    with pytest.raises(ConfigError, match="devices"):
        compare.split_args([f"devices={devices}"])


def test_the_figure_names_the_model_and_task_an_experiment_chose() -> None:
    settings, _, evolm_args = compare.split_args(["experiment=qwen15_paper_countdown"])
    cfg = compose_run(evolm_args)
    assert compare.title(cfg, evolm_args, settings).startswith(
        "qwen2.5-coder-1.5b-instruct, countdown: ES vs GRPO, 20 min"
    )
    tiny = compose_run([])
    assert compare.title(tiny, [], settings).startswith("tiny, conciseness:")


@pytest.mark.parametrize(
    ("per_generation", "expected"), [(None, 30 * 200 * 10.0), (8, 30 * 8 * 10.0)]
)
def test_es_tokens_count_every_training_puzzle_when_each_generation_takes_all(
    tmp_path: Path, per_generation: int | None, expected: float
) -> None:
    """``task.samples_per_generation: null`` (the paper's setting: every training puzzle every
    generation) counts ``train_size`` prompts per generation, not none (the 1.5B comparison's
    report failed on it)."""
    from baselines.report import Run

    config = {
        "es": {"population_size": 30},
        "task": {"samples_per_generation": per_generation, "train_size": 200},
    }
    run = Run("es", tmp_path, [], config, None)
    assert run.tokens({M.train_diagnostic(M.COMPLETION_TOKENS): 10.0}) == expected


def test_es_tokens_count_the_prompts_the_generation_scored(tmp_path: Path) -> None:
    """A generation's record says how many prompts it scored (``train/prompts``): that count,
    not ``train_size``, when ``task.train_n`` keeps only some of the training puzzles (the
    0.5B comparison: 96 three-number puzzles of 200; its report said 70.2 M tokens for 33.7 M)."""
    from baselines.report import Run

    config = {
        "es": {"population_size": 30},
        "task": {"samples_per_generation": None, "train_size": 200},
    }
    run = Run("es", tmp_path, [], config, None)
    record = {M.train_diagnostic(M.COMPLETION_TOKENS): 10.0, M.train_diagnostic(M.PROMPTS): 96.0}
    assert run.tokens(record) == 30 * 96 * 10.0


@pytest.mark.parametrize(
    ("comparison", "flagged"),
    [("qwen05-evolm-rollouts", {"es": False, "grpo": True}), ("qwen05-shots", {"es": False})],
)
def test_the_report_flags_a_method_whose_gain_is_a_template(
    comparison: str, flagged: dict[str, bool]
) -> None:
    """The committed 0.5B records (one H100): GRPO with evolm's rollouts rose 6.2% -> 16.4% on
    the paper's puzzles with 95% of its correct answers template-shaped and its lift +3.8 ->
    +7.8 points, ES 6.2% -> 16.0% with its lift +3.8 -> +9.3: the health monitor's test, applied
    start to end by the report, tells them apart."""
    from baselines.report import Run, markdown

    root = REPO / "docs" / "results" / "es-vs-grpo" / comparison
    runs = [Run.load(name, root / name) for name in flagged]
    assert {r.name: r.summary()["shortcut"] for r in runs} == flagged
    row = next(line for line in markdown(runs).splitlines() if "shortcut?" in line)
    assert row.count("**yes**") == sum(flagged.values())


@pytest.mark.skipif(not PAPER_FILE.is_file(), reason="the paper's countdown.json is not here")
def test_grpo_trains_on_the_puzzles_train_max_rule_share_keeps() -> None:
    """GRPO's training examples are the puzzles ES's windows visit after ``train_max_rule_share``
    thinned them: the paper's 152 of 200 at 0.1, every one of them kept by the task, none of the
    48 it dropped."""
    full = Countdown(data_file=str(PAPER_FILE), samples_per_generation=40,
                     eval_samples=None)  # fmt: skip
    thinned = Countdown(data_file=str(PAPER_FILE), samples_per_generation=40,
                        eval_samples=None, train_max_rule_share=0.1)  # fmt: skip
    key = lambda e: repr((e.prompt, e.reference))  # noqa: E731
    examples = {key(e) for e in train_split(thinned)}
    assert len(examples) == 152 and examples == {key(e) for e in thinned.train}
    assert len({key(e) for e in train_split(full)} - examples) == 48
