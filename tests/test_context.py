"""Prompts and ``task.max_new_tokens`` must fit the model's context (``max_position_embeddings``),
checked before the model loads (issue 31, items 7 and 8). Before: ``task.max_new_tokens=2048``
on the 1,024-position tiny model ran without a word (the engine planned 2,096 positions, past
what the model was built for), and so did a 3,200-character prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evolm.errors import ConfigError
from evolm.preflight.limits import check_prompts_fit
from evolm.task.conciseness import Conciseness
from evolm.task.countdown import Countdown
from tests.helpers import REPO, compose_config, run_cli

BUNDLED_EVAL = REPO / "evolm" / "data" / "conciseness" / "eval.jsonl"


def test_max_new_tokens_past_the_context_is_refused_before_the_model_loads(
    tiny_model_dir: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    proc = run_cli(
        ["debug=fast", "logger=none", "task.max_new_tokens=2048", f"hydra.run.dir={run_dir}"]
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert (
        "bad configuration: task.max_new_tokens: 2048 new tokens after the longest prompt "
        f"(33 tokens: {BUNDLED_EVAL}:8) need 2081 positions, more than the 1024 of the model "
        f"{tiny_model_dir} (max_position_embeddings). Fix: set task.max_new_tokens=991 or less"
    ) in out
    assert "evolm.model.loading" not in out and "ES over" not in out
    assert not run_dir.exists()


def write_questions(path: Path, questions: list[str]) -> str:
    lines = [json.dumps({"question": q, "answer": "blue"}) for q in questions]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_prompt_longer_than_the_context_names_its_file_and_line(
    tiny_model_dir: str, tmp_path: Path
) -> None:
    long = "Why is the sky blue? " * 160  # 3,360 characters, 1,920 tokens of the tiny model
    train = write_questions(tmp_path / "train.jsonl", ["Why?", long, "What colour?"])
    task = Conciseness(train_file=train, max_new_tokens=8)
    with pytest.raises(ConfigError) as raised:
        check_prompts_fit(tiny_model_dir, task, generations=3)
    assert str(raised.value) == (
        f"task: {tmp_path / 'train.jsonl'}:2 is 1920 tokens long, at least the 1024 positions of "
        f"the model {tiny_model_dir} (max_position_embeddings): nothing could be generated after "
        "it. Fix: shorten or drop that record, or use a model with a longer context"
    )
    short = write_questions(tmp_path / "short.jsonl", ["Why?", "What colour?"])
    check_prompts_fit(tiny_model_dir, Conciseness(train_file=short, max_new_tokens=8), 3)


@pytest.mark.slow  # make test-all (CI: the countdown runs of test_task_runs)
def test_countdown_names_the_puzzle_and_fits_the_countdown_model(
    tiny_model_dir: str, countdown_model_dir: str
) -> None:
    """Countdown's paper budget (1,024 new tokens) after a ~140-token prompt: over the plain
    tiny model's 1,024 positions (an error naming the puzzle), within the countdown build's
    2,048 (what ``task=countdown`` composes: the README's headline command starts)."""
    task = Countdown(eval_samples=4)
    with pytest.raises(ConfigError, match=r"task\.max_new_tokens: 1024 new tokens after the "):
        check_prompts_fit(tiny_model_dir, task, generations=40)
    with pytest.raises(ConfigError, match=r"tokens: generated \(seed 0\) puzzle \d+\)"):
        check_prompts_fit(tiny_model_dir, task, generations=40)
    assert compose_config(["task=countdown"]).model.max_position_embeddings == 2048
    check_prompts_fit(countdown_model_dir, task, generations=40)


def test_an_extra_eval_past_the_context_is_refused_before_the_model_loads(
    tiny_model_dir: str, tmp_path: Path
) -> None:
    """Issue 40 item 4: an extra eval's prompts and its own ``max_new_tokens`` are checked as
    the task's are (before: found only when the extra eval ran)."""
    from evolm.app import train
    from evolm.engine.local import LocalEngine

    cfg = compose_config(
        [
            *("debug=fast", "logger=none", "+task@extra_evals.long=conciseness"),
            "extra_evals.long.max_new_tokens=2048",
            f"output_dir={tmp_path / 'run'}",
        ]
    )
    loads = LocalEngine.loads
    with pytest.raises(ConfigError) as raised:
        train(cfg)
    assert str(raised.value) == (
        "extra_evals.long.max_new_tokens: 2048 new tokens after the longest prompt (33 tokens: "
        f"{BUNDLED_EVAL}:8) need 2081 positions, more than the 1024 of the model "
        f"{tiny_model_dir} (max_position_embeddings). Fix: set "
        "extra_evals.long.max_new_tokens=991 or less, or shorten that prompt"
    )
    assert LocalEngine.loads == loads
