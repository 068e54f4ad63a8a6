"""``python -m evolm.export``: the merged model computes exactly what base + adapter does."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from evolm.cli.export import MARKER, main
from evolm.lora import LoraLayout, LoraSpec, save_adapter
from evolm.lora.peft_io import read_adapter_config, read_adapter_weights
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


@pytest.mark.slow  # make test-all
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


def run_files(run_dir: Path) -> dict[str, bytes]:
    return {str(f): f.read_bytes() for f in sorted(run_dir.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("where", ["run", "parent", "adapter", "checkpoints"])
def test_out_that_would_delete_the_run_is_refused(
    run_dir: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    """--out the run directory, a folder holding it, or the run's own folders (before: the
    adapter, results and checkpoints were deleted)."""
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "gen-000003.pt").write_bytes(b"checkpoint")
    (run_dir / "results.jsonl").write_text('{"generation": 1}\n')
    out = {
        "run": run_dir,
        "parent": run_dir.parent,
        "adapter": run_dir / "adapter",
        "checkpoints": run_dir / "checkpoints" / "merged",
    }[where]
    before = run_files(run_dir.parent)
    assert main([str(run_dir), "--out", str(out)]) == 2
    assert run_files(run_dir.parent) == before
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["run"]  # no temp dir either
    assert f"cannot export {run_dir}: --out: {out.resolve()}" in caplog.text
    assert "would delete the run" in caplog.text or "which the run replaces" in caplog.text


def test_out_holding_other_files_is_refused(
    run_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A non-empty --out that is not an earlier export (before: the user's files were deleted);
    a file as --out too."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main([str(run_dir), "--out", str(out)]) == 2
    assert (out / "notes.txt").read_text() == "keep me" and len(list(out.iterdir())) == 1
    assert f"{out} already holds files and is not an earlier export" in caplog.text
    assert main([str(run_dir), "--out", str(out / "notes.txt")]) == 2
    assert (out / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "run"]


def test_export_replaces_an_earlier_export_readable_as_the_umask_says(
    run_dir: Path, tmp_path: Path
) -> None:
    """An earlier export (it holds the marker) or an empty folder is replaced, atomically; the
    merged model's files are 0644 and folders 0755 under umask 0022 (before: the folder 0700
    from mkdtemp and model.safetensors 0600)."""
    old = os.umask(0o022)
    try:
        out = tmp_path / "exported"
        out.mkdir()  # empty: fine
        for _ in range(2):  # then over the first export
            assert main([str(run_dir), "--out", str(out), "--dtype", "float32"]) == 0
            assert (out / MARKER).is_file() and (out / "model.safetensors").is_file()
            entries = [out, *out.rglob("*")]
            got = {str(p): stat.S_IMODE(p.stat().st_mode) for p in entries}
            want = {str(p): 0o755 if p.is_dir() else 0o644 for p in entries}
            assert got == want
        assert sorted(p.name for p in tmp_path.iterdir()) == ["exported", "run"]
        default = run_dir / "merged"  # an export from before the marker: replaced too
        default.mkdir()
        (default / "config.json").write_text("{}")
        assert main([str(run_dir)]) == 0
        assert (default / MARKER).is_file()
    finally:
        os.umask(old)


def test_a_checkpoints_mean_is_written_as_the_adapter_a_finished_run_writes(
    short_run: tuple[Path, str],
    tmp_path: Path,
    tiny_model_dir: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``--checkpoint latest --adapter-only``: the newest checkpoint of a finished run holds its
    final mean, so the adapter written from it equals the run's own ``adapter/``, tensor for
    tensor; a --base of another shape or none at all is one error naming the option."""
    run = tmp_path / "run"
    shutil.copytree(short_run[0], run)
    args = [str(run), "--checkpoint", "latest", "--adapter-only", "--base", tiny_model_dir]
    assert main(args) == 0
    (written,) = run.glob("adapter-gen*")
    got, final = read_adapter_weights(written), read_adapter_weights(run / "adapter")
    assert got.keys() == final.keys()
    assert all(torch.equal(got[k], final[k]) for k in final)
    assert read_adapter_config(written) == read_adapter_config(run / "adapter")

    wider = AutoConfig.from_pretrained(tiny_model_dir)
    wider.intermediate_size *= 2
    wider.save_pretrained(tmp_path / "wider")
    with caplog.at_level(logging.ERROR):
        assert main([*args[:-1], str(tmp_path / "wider")]) == 2
        assert main([*args[:-1], str(tmp_path / "nothing")]) == 2
    assert "--checkpoint: checkpoint" in caplog.text and "does not fit" in caplog.text
    assert f"--base: no transformers config at '{tmp_path / 'nothing'}'" in caplog.text
