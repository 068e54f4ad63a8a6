"""``python -m benchmarks.gemm_pad``: the projection GEMMs with the LoRA first factors' spare rows,
their output width ``N`` as it is and rounded up (GPU only).

The fast path computes ``u = x A^T`` of every member in the base GEMM's spare rows (:mod:`
evolm.engine.fast.lora`): ``N = out + members * modules * rank`` (rounded to 8). cuBLAS picks
its kernel by shape, and an ``N`` off the tile grid can cost far more than its extra columns:
this times, per projection group of a shape, ``N = out`` (base), ``out + spare`` and that
rounded up to 64, 128 and 256, each as 20 launches in a CUDA graph.

    python -m benchmarks.gemm_pad --shape qwen2.5-0.5b --shape qwen2.5-1.5b --json gemm.json
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

from benchmarks.kernels import graph_time
from benchmarks.shapes import SHAPES, shape_config

ROWS = (960, 1900, 6000)  # the toy's decode batch, W-real's steady state, W-real fixed
ROUNDS = (64, 128, 256)


def groups(shape: str, members: int, rank: int) -> dict[str, tuple[int, int, int]]:
    """``group -> (in, out, spare)`` of one layer: LoRA on all 7 projections."""
    c = shape_config(shape)
    hd = c.hidden_size // c.num_attention_heads
    q, kv = c.num_attention_heads * hd, c.num_key_value_heads * hd
    h, inter = c.hidden_size, c.intermediate_size

    def spare(modules: int) -> int:
        return -(-members * modules * rank // 8) * 8

    return {
        "qkv": (h, q + 2 * kv, spare(3)),
        "o": (q, h, spare(1)),
        "gate_up": (h, 2 * inter, spare(2)),
        "down": (inter, h, spare(1)),
    }


@torch.inference_mode()
def run(shape: str, members: int = 30, rank: int = 4) -> dict[str, Any]:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    out: dict[str, Any] = {"shape": shape, "members": members, "rank": rank, "groups": {}}
    for name, (k, n, spare) in groups(shape, members, rank).items():
        widths = {"base": n, "spare": n + spare}
        widths |= {f"round{r}": -(-(n + spare) // r) * r for r in ROUNDS}
        w = torch.randn(max(widths.values()), k, device=dev, dtype=torch.bfloat16, generator=gen)
        entry: dict[str, Any] = {"in": k, "widths": widths}
        for rows in ROWS:
            x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16, generator=gen)
            times = {}
            for label, width in widths.items():
                sub = w[:width]
                times[label] = graph_time(lambda s=sub, a=x: a @ s.t())
            entry[str(rows)] = times
            line = {"shape": shape, "group": name, "rows": rows, "us": times}
            print(json.dumps(line), flush=True)
        out["groups"][name] = entry
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gemm_pad")
    p.add_argument("--shape", action="append", choices=sorted(SHAPES))
    p.add_argument("--members", type=int, default=30)
    p.add_argument("--json")
    a = p.parse_args()
    result = [run(s, a.members) for s in a.shape or ["qwen2.5-0.5b", "qwen2.5-1.5b"]]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
