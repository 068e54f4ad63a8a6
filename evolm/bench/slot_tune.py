"""``python -m evolm.bench.slot_tune``: continuous batching's decode step, piece by piece (GPU).

Times the slot attention kernel over launch settings (block of positions, warps, stages) at
W-real's shape (every slot busy, lengths spread over the whole cache) with its achieved KV
bandwidth, and one whole decode step (eager, no graph) against its attention share.
"""

from __future__ import annotations

import itertools
import json
import sys

import torch

from evolm.bench.shapes import build_model
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


def main(shape: str = "qwen2.5-1.5b", rows: int = 3000, positions: int = 1152) -> dict:
    dev = torch.device("cuda")
    model = build_model(shape, dev, torch.bfloat16, seed=0)
    fast = FastModel(model)
    kvh, hd, g = fast.kv_heads, fast.head_dim, fast.heads // fast.kv_heads
    cache = fast.new_cache(rows + 1, positions)
    k, v = cache.k[0], cache.v[0]
    k.normal_()
    v.normal_()
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(rows, kvh, g, hd, device=dev, dtype=torch.bfloat16)
    sel = torch.randperm(rows, device=dev, generator=gen)
    hi = torch.randint(129, positions + 1, (rows,), device=dev, generator=gen)
    lo = torch.randint(0, 8, (rows,), device=dev, generator=gen)
    read = float(((hi - lo).sum() * kvh * hd * 2 * 2).item())
    out: dict = {"shape": shape, "rows": rows, "attention": []}
    for block_n, warps, stages in itertools.product((32, 64, 128), (2, 4, 8), (1, 2, 3)):
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


if __name__ == "__main__":
    main(*(sys.argv[1:2] or ["qwen2.5-1.5b"]))
