"""``python -m benchmarks.kernels``: time the LoRA-fused Triton kernels against their base
variants at one decode step's shapes, over launch settings (GPU only).

    python -m benchmarks.kernels --shape qwen2.5-0.5b --json kernels.json

For each kernel (SiLU-and-multiply, RoPE + cache write, residual-add + RMSNorm) it times the base
kernel and the LoRA-fused one under every setting of :data:`evolm.engine.kernels.fused.TUNE` in the
grid below, each as 20 launches captured in a CUDA graph (as the decode step replays them), and
prints microseconds per launch. The best settings go into ``TUNE``'s defaults by hand.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.shapes import SHAPES
from evolm.engine.fast.lora import GroupLora, RankActs, operand
from evolm.engine.kernels import tile_members

log = logging.getLogger(__name__)

GRID: dict[str, dict[str, list[int]]] = {
    "silu": {
        "dot": [1],
        "elems": [2048, 4096],
        "few_elems": [2048],
        "warps": [4, 8],
        "loop": [0, 2, 4, 8],
        "loop_rows": [0, 4096],
        "stages": [2, 3],
    },
    "rope": {"dot": [0, 1], "rows": [16, 32], "warps": [2, 4]},
    "norm": {"warps": [1, 2, 4, 8]},
}


def graph_time(fn: Callable[[], Any], launches: int = 20, reps: int = 10) -> float:
    """Microseconds per call of ``fn`` replayed from a CUDA graph of ``launches`` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / launches)
    return statistics.median(times)


def cases(shape: str, members: int, prompts: int, rank: int) -> dict[str, Any]:
    """The kernels' inputs at one decode step: ``members * prompts`` rows, bf16."""
    from evolm.engine.kernels import fused as T

    cfg = SHAPES[shape]
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, rows = hidden // heads, members * prompts
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(dev).manual_seed(0)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=dev) * scale).to(bf16)

    def group(splits: tuple[int, ...]) -> GroupLora:
        a = torch.empty(members, rank * len(splits), 1, device=dev, dtype=bf16)
        offsets = tuple(j * rank for j in range(len(splits)))
        return GroupLora(a, rand(members, rank, sum(splits), scale=0.1), offsets, splits)

    def gemm_out(out: int, g: GroupLora) -> tuple[torch.Tensor, RankActs]:
        y = rand(rows, out + members * g.cols)  # the base GEMM's output with every member's u
        return y[:, :out], RankActs(y[:, out:], g.cols)

    g_gu = group((inter, inter))
    gu, u_gu = gemm_out(2 * inter, g_gu)
    qkv_out = (heads + 2 * kv) * hd
    g_qkv = group((heads * hd, kv * hd, kv * hd))
    qkv, u_qkv = gemm_out(qkv_out, g_qkv)
    qkv = qkv.view(rows, heads + 2 * kv, hd)
    cos, sin = rand(rows, 1, hd).clamp(-1, 1), rand(rows, 1, hd).clamp(-1, 1)
    cache = (*(torch.zeros(rows, kv, 64, hd, device=dev, dtype=bf16) for _ in range(2)),)
    slot = torch.tensor([5], device=dev)
    g_d = group((hidden,))
    y, u_d = gemm_out(hidden, g_d)
    x, w = rand(rows, hidden), rand(hidden)
    rot = heads + kv
    # continuous batching: each row names its member, sorted by member (as the slot scheduler
    # orders its batches) or shuffled
    ordered = torch.arange(members, device=dev).repeat_interleave(prompts)
    shuffled = ordered[torch.randperm(rows, generator=gen, device=dev)]

    tiles = {id(m): tile_members(m) for m in (ordered, shuffled)}  # once per step, as the engine

    def rows_of(u: RankActs, g: GroupLora, member: torch.Tensor) -> Any:
        return operand(u, replace(g, member=member, tiles=tiles[id(member)]))

    per_row = {
        f"{name}_{order}": fn
        for order, member in (("sorted", ordered), ("shuffled", shuffled))
        for name, fn in (
            ("silu", lambda m=member: T.silu_mul(gu, rows_of(u_gu, g_gu, m))),
            (
                "rope",
                lambda m=member: T.qkv_rope(
                    qkv, cos, sin, rot, rows_of(u_qkv, g_qkv, m), (*cache, slot)
                ),
            ),
            ("norm", lambda m=member: T.add_rms_norm(x, w, 1e-6, y, rows_of(u_d, g_d, m))),
        )
    }
    member_major = {  # the waves path: rows member-major, no member ids
        "silu_member_major": lambda: T.silu_mul(gu, operand(u_gu, g_gu)),
        "rope_member_major": lambda: T.qkv_rope(
            qkv, cos, sin, rot, operand(u_qkv, g_qkv), (*cache, slot)
        ),
        "norm_member_major": lambda: T.add_rms_norm(x, w, 1e-6, y, operand(u_d, g_d)),
    }
    return {
        "per_row": {**member_major, **per_row},
        # tuned: continuous batching's batches, rows sorted by member
        "silu": (lambda: T.silu_mul(gu), per_row["silu_sorted"]),
        "rope": (
            lambda: T.qkv_rope(qkv, cos, sin, rot, cache=(*cache, slot)),
            per_row["rope_sorted"],
        ),
        "norm": (lambda: T.add_rms_norm(x, w, 1e-6, y), per_row["norm_sorted"]),
    }


def run(shape: str, members: int, prompts: int, rank: int, grid: bool = True) -> dict[str, Any]:
    from evolm.engine.kernels import fused as T

    out: dict[str, Any] = {"shape": shape, "members": members, "prompts": prompts, "rank": rank}
    kernels = cases(shape, members, prompts, rank)
    out["variants"] = {name: graph_time(fn) for name, fn in kernels.pop("per_row").items()}
    for name, us in out["variants"].items():
        log.info("%s %s (default settings): %7.2f us", shape, name, us)
    for name, (base, lora) in kernels.items():
        default = dict(T.TUNE[name])
        rows = [{"setting": "base", "us": graph_time(base)}]
        rows.append({"setting": f"lora {default} (default)", "us": graph_time(lora)})
        # (settings are caps: "rows" is lowered to a divisor of the rows per member)
        keys = list(GRID[name])
        for values in itertools.product(*(GRID[name][k] for k in keys)) if grid else ():
            T.TUNE[name] = {**default, **dict(zip(keys, values, strict=True))}
            rows.append({"setting": f"lora {T.TUNE[name]}", "us": graph_time(lora)})
        T.TUNE[name] = default
        out[name] = rows
        for row in rows:
            log.info("%s %s: %7.2f us  %s", shape, name, row["us"], row["setting"])
    return out


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(prog="python -m benchmarks.kernels", description=__doc__)
    p.add_argument("--shape", action="append", choices=sorted(SHAPES))
    p.add_argument("--members", type=int, default=30)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--no-grid", action="store_true", help="default settings only")
    p.add_argument("--json")
    args = p.parse_args(argv)
    records = [
        run(s, args.members, args.prompts, args.rank, not args.no_grid)
        for s in args.shape or ["qwen2.5-0.5b"]
    ]
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=2))


if __name__ == "__main__":
    main()
