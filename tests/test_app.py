"""End to end through the real CLI: the default demo learns; same config, same run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from evolm.task.conciseness import Conciseness
from tests.helpers import read_results, run_cli

# The demo's held-out conciseness reward (negative characters of excess length, averaged over
# the 8 bundled eval questions) must improve by at least this much from generation 0 to the end.
MARGIN_CHARS = 10.0


def test_default_demo_learns(tiny_model_dir: str, tmp_path: Path) -> None:
    """`python -m evolm` learns (on the session's cache, its tiny model built once for every
    test: a fresh cache's build and its progress lines are test_progress_log's).

    It takes < 60 s on 2 idle cores; the timeout is generous so a loaded CI machine does not fail
    a learning test on time (speed is measured by `make bench`, not by tests).
    """
    run_dir = tmp_path / "run"
    start = time.monotonic()
    proc = run_cli([f"hydra.run.dir={run_dir}"], timeout=300)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "NOT LEARNING" not in proc.stdout + proc.stderr  # the health monitor stays quiet
    records = read_results(run_dir)
    evals = [(r["generation"], r["eval/reward_mean"]) for r in records if "eval/reward_mean" in r]
    assert [g for g, _ in evals] == [0, 10, 20, 30, 40]
    first, last = evals[0][1], evals[-1][1]
    assert last >= first + MARGIN_CHARS, f"held-out reward {first} -> {last} in {elapsed:.0f}s"
    train = [r for r in records if "train/fitness_mean" in r]
    assert len(train) == 40
    for key in (
        "train/fitness_p20",
        "train/fitness_p80",
        "train/fitness_max",
        "es/update_norm",
        "time/generation_s",
        "time/generate_s",
        "time/es_s",
    ):
        assert all(key in r for r in train), key
    assert (run_dir / "figures" / "evolution.png").read_bytes()[:4] == b"\x89PNG"
    assert "population_size: 16" in (run_dir / "config.yaml").read_text()
    check_adapter_reproduces_eval(run_dir / "adapter", last)


def check_adapter_reproduces_eval(adapter: Path, expected_reward: float) -> None:
    """peft loads the final adapter unchanged and its greedy answers score the logged reward."""
    base_path = __import__("json").loads((adapter / "adapter_config.json").read_text())[
        "base_model_name_or_path"
    ]
    tok = AutoTokenizer.from_pretrained(base_path, padding_side="left")
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32), str(adapter)
    ).eval()
    task = Conciseness(max_new_tokens=32)
    examples = task.eval_examples()
    enc = tok([str(e.prompt) for e in examples], return_tensors="pt", padding=True)
    out = model.generate(
        **enc,
        max_new_tokens=32,
        do_sample=False,
        eos_token_id=[tok.eos_token_id, tok.pad_token_id],
        pad_token_id=tok.pad_token_id,
    )
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    rewards = task.score(examples, texts)["reward"]
    assert sum(rewards) / len(rewards) == expected_reward


@pytest.mark.slow  # make test-all (CI: test_interrupt resumes to the same run)
def test_same_config_same_run(tmp_path: Path) -> None:
    args = ["generations=3", "eval_every=1", "es.population_size=6", "task.max_new_tokens=12"]
    runs = []
    for name in ("a", "b"):
        proc = run_cli([*args, f"hydra.run.dir={tmp_path / name}"], timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        records = read_results(tmp_path / name)
        runs.append([{k: v for k, v in r.items() if not k.startswith("time/")} for r in records])
    assert runs[0] == runs[1]
    a, b = (tmp_path / n / "adapter" / "adapter_model.safetensors" for n in ("a", "b"))
    assert a.read_bytes() == b.read_bytes()
    seed1 = run_cli([*args, "seed=1", f"hydra.run.dir={tmp_path / 'c'}"], timeout=120)
    assert seed1.returncode == 0
    assert (tmp_path / "c" / "adapter" / "adapter_model.safetensors").read_bytes() != a.read_bytes()
