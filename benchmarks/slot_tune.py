"""``python -m benchmarks.slot_tune``: continuous batching's decode step, piece by piece (GPU).

Times the slot attention kernel over launch settings (block of positions, warps, stages) at
W-real's shape (every slot busy, lengths spread over the whole cache) with its achieved KV
bandwidth, and one whole decode step (eager, no graph) against its attention share;
``step``: a graphed decode step and its kernels; ``tiles``: a tail's plain and verify steps'
attention by tile height, and whether verify rows are bit-equal to plain rows.
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from benchmarks.shapes import build_model
from evolm.engine.fast.lora import FastLora
from evolm.engine.fast.model import FastModel
from evolm.engine.kernels.attention import slot_attention
from evolm.lora import LoraLayout, LoraSpec


def timed(fn: object, reps: int = 5) -> float:
    fn()  # type: ignore[operator]
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()  # type: ignore[operator]
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps / 1e3


def fill(cache: torch.Tensor) -> None:
    """Random finite values: normal ones, or fp8 bit patterns below 128 in magnitude."""
    if cache.element_size() == 1:
        cache.view(torch.uint8).random_(0, 112)
    else:
        cache.normal_()


def main(
    shape: str = "qwen2.5-1.5b", rows: int = 3000, positions: int = 1152, kv: str = "bf16"
) -> dict:
    from evolm.engine.kernels import FP8

    dev = torch.device("cuda")
    model = build_model(shape, dev, torch.bfloat16, seed=0)
    fast = FastModel(model)
    kvh, hd, g = fast.kv_heads, fast.head_dim, fast.heads // fast.kv_heads
    cache = fast.new_cache(rows + 1, positions, FP8 if kv == "fp8" else None)
    k, v = cache.k[0], cache.v[0]
    fill(k)
    fill(v)
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(rows, kvh, g, hd, device=dev, dtype=torch.bfloat16)
    sel = torch.randperm(rows, device=dev, generator=gen)
    hi = torch.randint(129, positions + 1, (rows,), device=dev, generator=gen)
    lo = torch.randint(0, 8, (rows,), device=dev, generator=gen)
    read = float(((hi - lo).sum() * kvh * hd * 2 * k.element_size()).item())
    out: dict = {"shape": shape, "rows": rows, "kv": kv, "attention": []}
    grid = itertools.product((32, 64, 128, 256), (2, 4, 8), (1, 2, 3, 4))
    for block_n, warps, stages in grid:
        tune = {"block_n": block_n, "warps": warps, "stages": stages}
        try:
            s = timed(lambda t=tune: slot_attention(q, k, v, sel, lo, hi, t))
        except Exception as e:  # a setting that does not compile (shared memory)
            out["attention"].append({**tune, "error": repr(e)[:200]})
            continue
        out["attention"].append({**tune, "ms": s * 1e3, "tb_s": read / s / 1e12})
    best = min((a for a in out["attention"] if "ms" in a), key=lambda a: a["ms"])
    out["best"] = best
    # one whole decode step (every layer), eager Triton ops, with LoRA of 30 members
    layout = LoraLayout.from_hf_config(model.config, LoraSpec(rank=4))
    ins, outs = fast.lora_dims()
    lora = FastLora(layout, 30, ins, outs, dev, torch.bfloat16, 8, fast.spare_rows)
    member = torch.randint(0, 30, (rows,), device=dev, generator=gen)
    view = lora.rows(member)
    tokens = torch.randint(0, 1000, (rows,), device=dev, generator=gen)
    cos, sin = fast.rope_tables(positions)
    pos = hi - 1
    c, s_ = cos[pos - lo], sin[pos - lo]
    full = fast.decode_slots(tokens, c, s_, sel, pos, lo, cache, view)
    del full
    for key, adapters in (("step_ms", view), ("step_base_ms", None)):
        step = lambda a=adapters: fast.decode_slots(tokens, c, s_, sel, pos, lo, cache, a)  # noqa: E731
        out[key] = timed(step) * 1e3
    out["attention_all_layers_ms"] = best["ms"] * len(fast.layers)
    print(json.dumps(out))
    return out


@torch.inference_mode()
def step_profile(
    shape: str = "qwen2.5-1.5b",
    rows: int = 6000,
    positions: int = 1152,
    kv: str = "fp8",
    quantize: bool = True,
) -> dict:
    """W-real's fixed regime at its steady state: every one of ``rows`` slots busy, lengths
    spread over 129..``positions``, LoRA of 30 members by row. One decode step + greedy head,
    timed as a CUDA graph, and its kernels (eager, profiler) grouped by name."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.tune import kernels
    from evolm.engine.fast.cudagraph import capture
    from evolm.engine.kernels import FP8

    dev = torch.device("cuda")
    model = build_model(shape, dev, torch.bfloat16, seed=0)
    fast = FastModel(model)
    fast.quantize(quantize)
    cache = fast.new_cache(rows + 1, positions, FP8 if kv == "fp8" else None)
    fill(cache.k)
    fill(cache.v)
    gen = torch.Generator(device=dev).manual_seed(0)
    sel = torch.randperm(rows, device=dev, generator=gen)
    hi = torch.randint(129, positions + 1, (rows,), device=dev, generator=gen)
    lo = torch.zeros(rows, dtype=torch.long, device=dev)
    layout = LoraLayout.from_hf_config(model.config, LoraSpec(rank=4))
    ins, outs = fast.lora_dims()
    lora = FastLora(layout, 30, ins, outs, dev, torch.bfloat16, 8, fast.spare_rows)
    member = torch.arange(30, device=dev).repeat_interleave(-(-rows // 30))[:rows]
    view = lora.rows(member)
    tokens = torch.randint(0, 1000, (rows,), device=dev, generator=gen)
    cos, sin = fast.rope_tables(positions)
    pos = hi - 1
    c, s_ = cos[pos - lo], sin[pos - lo]
    nxt = torch.zeros(rows, dtype=torch.long, device=dev)
    scratch = torch.empty(1024, fast.lm_head.weight.shape[0], dtype=torch.bfloat16, device=dev)
    out: dict = {"shape": shape, "rows": rows, "kv": kv, "quantize": quantize}
    for key, adapters in (("lora", view), ("base", None)):

        def step(a: object = adapters) -> None:
            x = fast.decode_slots(tokens, c, s_, sel, pos, lo, cache, a)  # type: ignore[arg-type]
            fast.greedy(x, nxt, scratch)

        graph = capture(step, None)
        out[f"{key}_graph_ms"] = timed(graph.replay, 10) * 1e3
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        out[f"{key}_kernels"] = kernels(prof, 1, 20)
        del graph
    kv_bytes = float((hi - lo).sum()) * fast.kv_heads * fast.head_dim * 2 * cache.k[0].itemsize
    out["kv_bytes_per_layer"] = kv_bytes
    print(json.dumps(out))
    return out


@torch.inference_mode()
def tiles(shape: str = "qwen2.5-0.5b", rows: int = 300, positions: int = 1400, k: int = 4) -> dict:
    """A generation's tail, one layer's attention: ``rows`` slots busy at lengths over
    129..``positions``, as a plain step (one row each) and as a verify step (each row's
    ``k + 1`` verify rows), for each tile height (``SLOT_TUNE["tile"]``: 16 is the engine's;
    64 puts a 0.5B row's 5 verify rows in one program). Also whether each verify row's output
    is bit-equal to the plain program's at the same position (speculation's exactness)."""
    from evolm.engine.kernels.attention import SLOT_TUNE, verify_chunk

    dev = torch.device("cuda")
    fast = FastModel(build_model(shape, dev, torch.bfloat16, seed=0))
    kvh, hd, g = fast.kv_heads, fast.head_dim, fast.heads // fast.kv_heads
    cache = fast.new_cache(rows + 1, positions + k + 1, None)
    fill(cache.k[0])
    fill(cache.v[0])
    gen = torch.Generator(device=dev).manual_seed(0)
    sel = torch.randperm(rows, device=dev, generator=gen)
    hi = torch.randint(129, positions + 1, (rows,), device=dev, generator=gen)
    lo = torch.randint(0, 8, (rows,), device=dev, generator=gen)
    width = k + 1
    run_hi = (hi[:, None] + torch.arange(width, device=dev)).reshape(-1)
    each = lambda t: t.repeat_interleave(width)  # noqa: E731
    q = torch.randn(rows * width, kvh, g, hd, device=dev, dtype=torch.bfloat16)
    k0, v0 = cache.k[0], cache.v[0]
    out: dict = {"shape": shape, "rows": rows, "k": k, "g": g, "tiles": []}
    for tile in (16, 32, 64):
        tune = {**SLOT_TUNE, "tile": tile}
        plain = lambda t=tune: slot_attention(q[::width], k0, v0, sel, lo, hi, t)  # noqa: E731
        verify = lambda t=tune: slot_attention(  # noqa: E731
            q, k0, v0, each(sel), each(lo), run_hi, t, span=width
        )
        one = slot_attention(q, k0, v0, each(sel), each(lo), run_hi, tune)
        out["tiles"].append(
            {
                "tile": tile,
                "rows_a_program": verify_chunk(g, tile),
                "plain_ms": timed(plain) * 1e3,
                "verify_ms": timed(verify) * 1e3,
                "verify_bit_equal": bool(torch.equal(verify(), one)),
            }
        )
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m benchmarks.slot_tune")
    p.add_argument("what", nargs="?", default="attention", choices=["attention", "step", "tiles"])
    p.add_argument("--shape", default="qwen2.5-1.5b")
    p.add_argument("--rows", type=int)
    p.add_argument("--kv", default="bf16", choices=["bf16", "fp8"])
    p.add_argument("--bf16-gemms", action="store_true", help="step: no fp8 GEMMs")
    a = p.parse_args()
    if a.what == "step":
        step_profile(a.shape, a.rows or 6000, kv=a.kv, quantize=not a.bf16_gemms)
    elif a.what == "tiles":
        tiles(a.shape, a.rows or 300)
    else:
        main(a.shape, a.rows or 3000, kv=a.kv)
