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


@pytest.mark.slow  # 7 minutes on one core of a CI machine: `make test-all`; GPUs run it compiled
def test_triton_fast_path_equals_hf_interpreted() -> None:
    """Every kernel against torch, then prefill + decode in Triton mode (residual add + RMSNorm,
    RoPE and SiLU kernels with the LoRA fused in; u from the weights' spare rows) against the
    HF model with MultiLoraLinear: the same <= 1e-4 as the eager fast path. Continuous
    batching's kernel variants give the eager path's greedy tokens. Then the same on a
    SmolLM2-shaped Llama (no q/k/v bias, tied embeddings, 3 query heads per KV head)."""
    script = Path(__file__).with_name("interpreted_triton.py")
    root = str(script.parents[1])  # the script imports benchmarks/ (not installed)
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("lora_16", "base_16", "lora_3", "base_3", "llama_lora"):
        assert out[key] <= 1e-4, (key, out)
    hidden_qkv = 128 + 2 * 64  # tiny model: q 128, k and v 64 each
    assert out["spare_rows"] > hidden_qkv  # A went into the weight buffer
    assert out["slots_equal"], "continuous batching's kernels disagree with the eager path"
    assert out["slots_fp8_equal"], "the fp8 cache's kernels disagree with the eager fp8 path"
    assert out["quantizer_equal"], "the fp8 row quantizer disagrees with its torch ops"
