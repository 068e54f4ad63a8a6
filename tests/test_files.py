"""Directories written atomically are readable by others as the umask says (evolm.files): the
cached model, the run's adapter; and the inter-process lock."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from evolm.files import current_umask, file_lock, publish_dir, temp_dir_beside
from evolm.lora import LoraLayout, LoraSpec, save_adapter
from evolm.model import TinyModel
from tests.helpers import REPO

QUICK = {"warmup_steps": 3}


@pytest.fixture(params=[0o022, 0o027], ids=["umask-022", "umask-027"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """The process umask set to the parameter for the test."""
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def modes(root: Path) -> dict[str, int]:
    """``{relative path: permission bits}`` of ``root`` and everything below it."""
    entries = [root, *root.rglob("*")]
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in entries}


def assert_umask_modes(root: Path, mask: int) -> None:
    want = {name: (0o777 if (root / name).is_dir() else 0o666) & ~mask for name in modes(root)}
    assert modes(root) == want


def test_current_umask_reads_the_process_umask(umask: int) -> None:
    assert current_umask() == umask


def test_cached_model_is_readable_as_the_umask_says(tmp_path: Path, umask: int) -> None:
    """The tiny model built into the cache (before: model.safetensors 0600, written so by
    safetensors; the folder 0755 whatever the umask)."""
    target = Path(TinyModel(cache_dir=str(tmp_path), **QUICK).resolve())
    assert (target / "model.safetensors").is_file()
    assert_umask_modes(target, umask)


def test_adapter_is_readable_as_the_umask_says(
    tmp_path: Path, tiny_model_dir: str, umask: int
) -> None:
    """The run's adapter/ (before: the folder 0700 from mkdtemp, the weights 0600)."""
    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), LoraSpec())
    tensors = [torch.zeros(shape) for shape in layout.shapes()]
    for _ in range(2):  # written, then replaced
        path = save_adapter(tmp_path / "adapter", layout, tensors, base_model=tiny_model_dir)
        assert_umask_modes(path, umask)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]  # no temp dirs left


def test_publish_dir_keeps_execute_bits_and_an_existing_target(tmp_path: Path, umask: int) -> None:
    target = tmp_path / "out"
    with temp_dir_beside(target) as tmp:
        (tmp / "run.sh").write_text("#!/bin/sh\n")
        (tmp / "run.sh").chmod(0o700)
        assert publish_dir(tmp, target)
    assert stat.S_IMODE((target / "run.sh").stat().st_mode) == 0o777 & ~umask
    with temp_dir_beside(target) as tmp:
        (tmp / "other").write_text("x")
        assert not publish_dir(tmp, target, replace=False)  # another process published first
    assert sorted(p.name for p in target.iterdir()) == ["run.sh"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


HOLD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from evolm.files import file_lock

    lock, log, start = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[4])
    while time.time() < start:  # every process asks for the lock at the same moment
        time.sleep(0.001)
    with file_lock(lock):
        with open(log, "a") as f:
            f.write(f"in {sys.argv[3]}\\n")
        time.sleep(0.3)
        with open(log, "a") as f:
            f.write(f"out {sys.argv[3]}\\n")
    """
)


def test_file_lock_excludes_other_processes(tmp_path: Path) -> None:
    """Processes taking one lock at once hold it one after the other."""
    log, start = tmp_path / "log", time.time() + 3
    lock = tmp_path / "sub" / "x.lock"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HOLD, str(lock), str(log), str(i), str(start)], cwd=REPO
        )
        for i in range(3)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    lines = log.read_text().split()
    pairs = [(lines[i], lines[i + 1], lines[i + 2], lines[i + 3]) for i in range(0, 12, 4)]
    assert all(a == "in" and c == "out" and b == d for a, b, c, d in pairs), lines
    with file_lock(lock).acquire(timeout=1):  # free again once its holders are gone
        assert (tmp_path / "sub").is_dir()
