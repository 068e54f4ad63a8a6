# The script that produced docs/benchmarks/h100-overlap-probe.json: run_1 as it is, run_2 with
# probe2.diff applied (patch -o probe2.py probe.py probe2.diff). Kept as it ran:
# PYTHONPATH=. python3 docs/benchmarks/overlap-probe/probe.py qwen2.5-1.5b:1600 qwen2.5-7b:700
"""GPU probe: where can a continuous-batching decode step get faster? (scratch, not shipped)

1. two halves of the batch on two streams (naive / attention alternated by events), in a graph,
   with and without a cuBLAS SM carve-out;
2. slot attention over an fp8 cache vs bf16;
3. LM-head greedy block sizes;
4. members sorted vs random (per-row LoRA gathers).
"""

from __future__ import annotations

import json
import sys

import torch

from evolm.bench.shapes import build_model
from evolm.engine.fast.lora import FastLora
from evolm.engine.fast.model import FastModel, _group, _pending
from evolm.engine.kernels.attention import slot_attention
from evolm.lora import LoraLayout, LoraSpec

dev = torch.device("cuda")


def timed(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def graphed(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


class Half:
    def __init__(self, fast, lora, tokens, c, s, sel, pos, lo, member):
        self.fast, self.tokens, self.c, self.s = fast, tokens, c[:, None], s[:, None]
        self.sel, self.pos, self.lo, self.hi = sel, pos, lo, pos + 1
        self.view = None if lora is None else lora.rows(member)

    def start(self):
        self.x = torch.nn.functional.embedding(self.tokens, self.fast.embed)
        self.pending = None

    def pre(self, i, cache):
        f, w = self.fast, self.fast.layers[i]
        h = f.add_norm(self.x, self.pending, w.ln1)
        q, _, _ = f._qkv(i, w, h, self.view, self.c, self.s, (cache.k[i], cache.v[i], self.sel, self.pos))
        self.q = q.reshape(q.shape[0], f.kv_heads, f.heads // f.kv_heads, f.head_dim)

    def attn(self, i, cache):
        self.a = slot_attention(self.q, cache.k[i], cache.v[i], self.sel, self.lo, self.hi)

    def post(self, i):
        f, w = self.fast, self.fast.layers[i]
        a = self.a.reshape(self.a.shape[0], f.q_out)
        h = f.add_norm(self.x, _pending(w.o, a, _group(self.view, i, "o")), w.ln2)
        self.pending = f._mlp(i, w, h, self.view)

    def finish(self):
        return self.fast.add_norm(self.x, self.pending, self.fast.norm)


def run_shape(shape, rows, positions=1152):
    out = {"shape": shape, "rows": rows}
    model = build_model(shape, dev, torch.bfloat16, seed=0)
    fast = FastModel(model)
    gen = torch.Generator(device=dev).manual_seed(0)
    cache = fast.new_cache(rows + 1, positions)
    cache.k.normal_(generator=gen)
    cache.v.normal_(generator=gen)
    layout = LoraLayout.from_hf_config(model.config, LoraSpec(rank=4))
    ins, outs = fast.lora_dims()
    lora = FastLora(layout, 30, ins, outs, dev, torch.bfloat16, 8, fast.spare_rows)
    for g in lora.groups.values():
        g.Bt.normal_(generator=gen).mul_(0.01)
    sel = torch.randperm(rows, device=dev, generator=gen)
    hi = torch.randint(129, positions + 1, (rows,), device=dev, generator=gen)
    lo = torch.randint(0, 8, (rows,), device=dev, generator=gen)
    pos = hi - 1
    member = torch.randint(0, 30, (rows,), device=dev, generator=gen)
    tokens = torch.randint(0, 1000, (rows,), device=dev, generator=gen)
    cos, sin = fast.rope_tables(positions)
    c, s = cos[pos - lo], sin[pos - lo]

    def full(mem=member):
        view = lora.rows(mem)
        return fast.decode_slots(tokens, c, s, sel, pos, lo, cache, view)

    def attempt(key, fn):
        try:
            out[key] = fn()
        except Exception as e:
            out[key] = repr(e)[:300]
        print(key, out[key], flush=True)

    attempt("step_eager_ms", lambda: timed(full))
    attempt("step_graph_ms", lambda: timed(graphed(full).replay))
    sorted_mem = torch.sort(member).values
    attempt("step_graph_sorted_members_ms", lambda: timed(graphed(lambda: full(sorted_mem)).replay))
    attempt("step_graph_base_ms", lambda: timed(graphed(lambda: fast.decode_slots(tokens, c, s, sel, pos, lo, cache, None)).replay))

    half = rows // 2
    parts = [
        Half(fast, lora, tokens[a:b], c[a:b], s[a:b], sel[a:b], pos[a:b], lo[a:b], member[a:b])
        for a, b in ((0, half), (half, rows))
    ]
    n = len(fast.layers)

    def one_stream():
        for p in parts:
            p.start()
            for i in range(n):
                p.pre(i, cache)
                p.attn(i, cache)
                p.post(i)
            p.finish()

    def attn_only():
        for p in parts:
            for i in range(n):
                p.attn(i, cache)

    attempt("halves_serial_graph_ms", lambda: timed(graphed(one_stream).replay))
    for p in parts:
        p.start()
        p.pre(0, cache)
    attempt("attention_all_layers_ms", lambda: timed(graphed(attn_only).replay))

    def two_streams(alternate):
        main = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(main)
        streams = [main, side]
        ev = [[torch.cuda.Event() for _ in range(n)] for _ in parts]
        for k, p in enumerate(parts):
            with torch.cuda.stream(streams[k]):
                p.start()
        for i in range(n):
            for k, p in enumerate(parts):
                with torch.cuda.stream(streams[k]):
                    p.pre(i, cache)
                    if alternate:
                        if k == 0 and i > 0:
                            streams[0].wait_event(ev[1][i - 1])
                        if k == 1:
                            streams[1].wait_event(ev[0][i])
                    p.attn(i, cache)
                    ev[k][i].record()
                    p.post(i)
        for k, p in enumerate(parts):
            with torch.cuda.stream(streams[k]):
                p.finish()
        main.wait_stream(side)

    for alt in (False, True):
        key = "two_streams_alternate_ms" if alt else "two_streams_naive_ms"
        try:
            out[key] = timed(graphed(lambda a=alt: two_streams(a)).replay)
        except Exception as e:
            out[key] = repr(e)[:300]
    for carve in (8, 16, 32, 48):
        try:
            torch._C._set_sm_carveout_experimental(carve)
            out[f"carveout_{carve}_alternate_ms"] = timed(graphed(lambda: two_streams(True)).replay)
            out[f"carveout_{carve}_single_ms"] = timed(graphed(full).replay)
        except Exception as e:
            out[f"carveout_{carve}"] = repr(e)[:300]
        finally:
            torch._C._set_sm_carveout_experimental(None)
    # fp8 cache attention
    q = torch.randn(rows, fast.kv_heads, fast.heads // fast.kv_heads, fast.head_dim, device=dev, dtype=torch.bfloat16)
    k8, v8 = cache.k[0].to(torch.float8_e4m3fn), cache.v[0].to(torch.float8_e4m3fn)
    attempt("attn_layer_bf16_ms", lambda: timed(lambda: slot_attention(q, cache.k[0], cache.v[0], sel, lo, hi)))
    for bn, wp, st in ((64, 4, 3), (128, 4, 3), (64, 8, 3), (128, 8, 2)):
        try:
            t = {"block_n": bn, "warps": wp, "stages": st}
            out[f"attn_layer_fp8_ms_{bn}_{wp}_{st}"] = timed(lambda t=t: slot_attention(q, k8, v8, sel, lo, hi, t))
        except Exception as e:
            out[f"attn_fp8_{bn}_{wp}_{st}"] = repr(e)[:300]
    def err():
        ref = slot_attention(q, cache.k[0], cache.v[0], sel, lo, hi).float()
        got = slot_attention(q, k8, v8, sel, lo, hi).float()
        return float((got - ref).norm() / ref.norm())
    attempt("attn_fp8_rel_err", err)
    # LM head greedy block sizes
    h = torch.randn(rows, fast.hidden, device=dev, dtype=torch.bfloat16)
    toks = torch.empty(rows, dtype=torch.long, device=dev)
    for blk in (256, 512, 1024, 2048, rows):
        scratch = torch.empty(blk, fast.lm_head.weight.shape[0], device=dev, dtype=torch.bfloat16)
        attempt(f"greedy_{blk}_ms", lambda sc=scratch: timed(lambda: fast.greedy(h, toks, sc)))
        del scratch
    print(json.dumps(out), flush=True)
    del model, fast, cache, lora
    torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    results = []
    for spec in sys.argv[1:]:
        shape, rows = spec.split(":")
        results.append(run_shape(shape, int(rows)))
    print(json.dumps(results, indent=1))
