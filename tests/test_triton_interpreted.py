"""The GPU path's Triton kernels, interpreted on CPU (``TRITON_INTERPRET=1``) in fp32.

On a GPU, ``test_fastpath.py``'s CUDA tests check the same kernels compiled, in fp32 and bf16.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


@pytest.mark.slow  # 7-10 minutes on one core of a CI machine: `make test-all`; GPUs run it compiled
def test_triton_fast_path_equals_hf_interpreted() -> None:
    """Every kernel against torch, then prefill + decode in Triton mode (residual add + RMSNorm,
    RoPE and SiLU kernels with the LoRA fused in; u from the weights' spare rows) against the
    HF model with MultiLoraLinear: the same <= 1e-4 as the eager fast path. Continuous
    batching's kernel variants give the eager path's greedy tokens. Then the same on a
    SmolLM2-shaped Llama (no q/k/v bias, tied embeddings, 3 query heads per KV head)."""
    out = run_interpreted(timeout=1800)  # 578-645 s on the developers' 2-core machine (2026-12)
    for key in ("lora_16", "base_16", "lora_3", "base_3", "llama_lora"):
        assert out[key] <= 1e-4, (key, out)
    hidden_qkv = 128 + 2 * 64  # tiny model: q 128, k and v 64 each
    assert out["spare_rows"] > hidden_qkv  # A went into the weight buffer
    assert out["slots_equal"], "continuous batching's kernels disagree with the eager path"
    assert out["slots_fp8_equal"], "the fp8 cache's kernels disagree with the eager fp8 path"
    assert out["quantizer_equal"], "the fp8 row quantizer disagrees with its torch ops"
    assert_speculation_exact(out["speculate"])


def test_speculative_decoding_equals_plain_in_triton_mode() -> None:
    """``server.speculate``'s verify steps through the GPU path's kernels (interpreted): the
    tokens of plain decoding, in fewer steps. The CPU tests check the eager path; this is the
    only check of the Triton one short of a GPU."""
    assert_speculation_exact(run_interpreted("speculate")["speculate"])


def assert_speculation_exact(spec: dict[str, float]) -> None:
    assert spec["equal"] == 1.0, spec
    # the verify rows' attention against the one-row kernel's: bit-equal on a GPU (the PTX
    # test, and the GPU tests on an H100); interpreted, it is numpy's float32 arithmetic, whose
    # last bits follow the CPU's SIMD code paths (0 on an Intel Xeon with AVX-512, up to 2.4e-7
    # on an AMD EPYC without it, session 31): a few ulps, and an unwritten row (inf) fails
    assert spec["span_max_diff"] <= 1e-6, spec
    assert 0 < spec["spec_steps"] < spec["plain_steps"], spec  # verify steps ran, fewer of them
    assert spec["spec_kept"] > spec["spec_steps"], spec  # and kept drafted tokens
    assert spec["spec_drafted_per_row"] == 3.0, spec  # k = 3 for every row, near its budget too


def run_interpreted(*args: str, timeout: float = 600) -> dict:
    """``interpreted_triton.py`` in a subprocess with ``TRITON_INTERPRET=1``: its JSON line."""
    script = Path(__file__).with_name("interpreted_triton.py")
    root = str(script.parents[1])  # the script imports benchmarks/ (not installed)
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, str(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
