"""The forgetting check: tasks the mean is also scored on at every eval (``extra_evals``)."""

from __future__ import annotations

from pathlib import Path

from evolm.app import train
from tests.helpers import compose_config, read_results


def test_an_extra_eval_task_is_scored_at_every_eval(tmp_path: Path, tiny_model_dir: str) -> None:
    """The run's own task added again as an extra eval scores exactly what the eval does, at
    the same generations; the second task's scores come under its own name."""
    run = tmp_path / "run"
    cfg = compose_config(
        [
            "debug=fast",
            "logger=none",
            "+task@extra_evals.again=conciseness",
            "extra_evals.again.max_new_tokens=8",  # as debug=fast sets task.max_new_tokens
            "+task@extra_evals.countdown=countdown",
            "extra_evals.countdown.eval_samples=4",
            "extra_evals.countdown.max_new_tokens=8",
            f"output_dir={run}",
        ]
    )
    train(cfg)
    records = read_results(run)
    evals = [r for r in records if "eval/reward_mean" in r]
    assert [r["generation"] for r in evals] == [0, 1, 2, 3]
    assert all(r["eval/again/reward_mean"] == r["eval/reward_mean"] for r in evals)
    assert all("eval/countdown/accuracy_mean" in r for r in evals)
    # its set-level numbers too (Countdown.summarize), under its name
    assert all("eval/countdown/shortcut_accuracy" in r for r in evals)
    assert all("eval/countdown/template_solvable_share" in r for r in evals)
    assert "eval/shortcut_accuracy" not in evals[0]  # the run's own task is conciseness
    assert all("eval/again/reward_mean" not in r for r in records if r not in evals)
