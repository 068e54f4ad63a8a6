"""``python -m evolm.export``: the merged model computes exactly what base + adapter does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from evolm.export import main
from evolm.lora import LoraLayout, LoraSpec, save_adapter
from tests.helpers import REPO


@pytest.fixture
def run_dir(tmp_path: Path, tiny_model_dir: str) -> Path:
    """A run directory whose adapter moves the model visibly (random A and B)."""
    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), LoraSpec())
    gen = torch.Generator().manual_seed(0)
    tensors = [torch.randn(shape, generator=gen) * 0.1 for shape in layout.shapes()]
    save_adapter(tmp_path / "run" / "adapter", layout, tensors, base_model=tiny_model_dir)
    return tmp_path / "run"


def test_merged_logits_equal_peft(
    run_dir: Path, tiny_model_dir: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run_dir.parent / "merged"
    assert main([str(run_dir), "--out", str(out), "--dtype", "float32"]) == 0
    printed = capsys.readouterr().out
    adapter = run_dir.resolve() / "adapter"
    for needle in (
        f"--lora-paths evolm={adapter}",
        "/load_lora_adapter",
        f"--lora-modules evolm={adapter}",
        "/v1/load_lora_adapter",
        "--max-lora-rank 8",
        "PeftModel.from_pretrained",
    ):
        assert needle in printed, needle

    tok = AutoTokenizer.from_pretrained(out)
    ids = tok(
        ["What is the capital of France?", "Name a prime number."],
        return_tensors="pt",
        padding=True,
    )
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        base_logits = base(**ids).logits
        peft = PeftModel.from_pretrained(base, str(adapter)).eval()
        expected = peft(**ids).logits
        merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        got = merged(**ids).logits
    assert not torch.allclose(expected, base_logits, atol=1e-3), "the adapter changes nothing"
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert (
        tok("hello")["input_ids"]
        == AutoTokenizer.from_pretrained(tiny_model_dir)("hello")["input_ids"]
    )


def test_missing_adapter_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "adapter/adapter_config.json does not exist" in capsys.readouterr().err


def test_export_prints_no_future_warning(run_dir: Path) -> None:
    """What a user runs prints no library deprecation: peft's ``PeftModel`` read transformers'
    deprecated ``is_gradient_checkpointing`` (a FutureWarning on every export)."""
    out = run_dir.parent / "merged"
    command = [sys.executable, "-W", "default::FutureWarning", "-m", "evolm.export"]
    done = subprocess.run(
        [*command, str(run_dir), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert (out / "config.json").is_file()
    assert "Warning" not in done.stderr, done.stderr
