"""Run with ``TRITON_INTERPRET=1`` (set before Triton is imported): the Triton kernels and the
whole fast path in Triton mode on CPU tensors in fp32. Prints one JSON line of results.

Driven by ``test_triton_interpreted.py`` in a subprocess; the interpreter checks the kernels'
logic (indexing, masks, LoRA offsets, the fused residual add) on the CPU machines, where no GPU
can compile them. bf16 is not checked here: the interpreter's bf16 dot is wrong.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

from test_fastpath import check_forced, check_triton_ops, llama_model, population

from benchmarks.harness import from_model, generate_ids, with_options
from benchmarks.shapes import build_model
from evolm.engine.local import LocalEngine
from evolm.lora import LoraLayout, LoraSpec
from evolm.sampling import Sampling


def check_slots(engine: LocalEngine, layout: LoraLayout) -> bool:
    """Continuous batching in Triton mode (per-row members in the LoRA kernels, per-row cache
    rows / positions in the RoPE kernel, per-row bounds in the slot attention kernel) with
    refills, mixed budgets and left padding: the same greedy tokens as the eager path."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 200, (6, 5), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[4, :1] = 0
    member = torch.tensor([2, 0, 1, 1, 0, 2])
    budgets = [4, 2, 3, 1, 4, 2]
    pop = population(layout, 3)
    capped = with_options(engine, max_batch_rows=3)
    assert capped.fast is not None
    sampling = Sampling(max_new_tokens=4)
    kw = dict(member=member, budgets=budgets, eos_ids=[])
    triton_tokens = generate_ids(capped, ids, mask, pop, sampling, **kw)  # type: ignore[arg-type]
    capped.fast.scheduler.model.set_ops("eager")
    eager_tokens = generate_ids(capped, ids, mask, pop, sampling, **kw)  # type: ignore[arg-type]
    capped.fast.scheduler.model.set_ops("triton")
    return bool(torch.equal(triton_tokens, eager_tokens))


def check_speculate(engine: LocalEngine, layout: LoraLayout) -> dict[str, float]:
    """Speculative decoding's verify steps in Triton mode (``server.speculate``: k + 1 tokens a
    row through the fused LoRA, RoPE and norm kernels, per-token members): the same greedy tokens
    as plain decoding in Triton mode, rows of two members with their own budgets and left
    padding. Returns ``equal`` (1.0 or 0.0) and the verify steps' counts."""
    gen = torch.Generator().manual_seed(2)  # prompts whose rows repeat themselves: fewer steps
    ids = torch.randint(5, 200, (3, 5), generator=gen)
    mask = torch.ones_like(ids)
    mask[2, :2] = 0
    rows, masks, pop = ids.repeat(2, 1), mask.repeat(2, 1), population(layout, 2)
    # prompts of 5 + the widest budget 27 = 32 positions, a multiple of the cache's rounding:
    # the widest rows' last drafts are fed at their slot's last position (none planned past it)
    sampling, budgets = Sampling(max_new_tokens=27), [27, 6, 10] * 2
    plain = generate_ids(engine, rows, masks, pop, sampling, budgets=budgets, eos_ids=[])
    spec = with_options(engine, speculate=3, speculate_rows=1000)
    # slots for every row's 4 tokens (one generation of 4 x the rows, all but one stopping after
    # their first token; eager ops: only its plan matters), so every step verifies all the rows
    wide = [27] + [1] * (4 * len(budgets) - 1)
    assert spec.fast is not None
    spec.fast.scheduler.model.set_ops("eager")
    generate_ids(
        spec, rows.repeat(4, 1), masks.repeat(4, 1), pop, sampling, budgets=wide, eos_ids=[]
    )
    spec.fast.scheduler.model.set_ops("triton")
    got = generate_ids(spec, rows, masks, pop, sampling, budgets=budgets, eos_ids=[])
    timings = spec.last_timings
    return {
        "equal": float(torch.equal(got, plain)),
        "span_max_diff": check_span_attention(),
        "spec_steps": timings.get("spec_steps", 0.0),
        "spec_kept": timings.get("spec_kept", 0.0),
        "spec_drafted_per_row": timings.get("spec_drafted", 0.0) / timings.get("spec_rows", 1.0),
        "plain_steps": engine.last_timings["steps"],
    }


def check_span_attention() -> float:
    """The verify rows' slot attention (``span``: runs of one slot's consecutive positions,
    chunks of a run in one program reading the slot's cache once) against the one-row
    kernel, on random data: four runs of different slots, prompt starts and ends (one run
    across more than one block of 64 positions, one whose last rows are capped at the cache's
    last position, their ends equal), with 3 query heads per KV head (runs of 4 rows in one
    program) and 7 (runs of 5 in programs of 2, 2 and 1; in one, with 64-row tiles). Returns
    the largest difference."""
    from evolm.engine.kernels.attention import SLOT_TUNE, slot_attention

    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 5, 2, 150, 16, generator=gen)
    sel, lo = torch.tensor([3, 1, 4, 0]), torch.tensor([0, 5, 2, 100])
    pos = torch.tensor([10, 130, 33, 147])
    worst = 0.0
    for g, span, tile in ((3, 4, 16), (7, 5, 16), (7, 5, 64)):
        hi = (pos[:, None] + torch.arange(span) + 1).clamp(max=k.shape[2]).reshape(-1)
        rows = sel.repeat_interleave(span), lo.repeat_interleave(span)
        q = torch.randn(len(hi), 2, g, 16, generator=gen)
        tune = {**SLOT_TUNE, "tile": tile}  # 64: a run of 5 rows of 7 queries in one program
        runs = slot_attention(q, k, v, rows[0], rows[1], hi, tune, span=span)
        one = slot_attention(q, k, v, rows[0], rows[1], hi, tune)  # after: no buffer reused
        diff = (runs - one).abs().nan_to_num(nan=float("inf"))  # an unwritten row: NaN
        worst = max(worst, float(diff.max()))
    return worst


def check_quantizer() -> bool:
    """The per-row fp8 quantizer (``quantization=fp8``) on rows of values fp8 holds exactly
    after scaling (each row's amax 448 times a power of two; the interpreter's own fp32 -> fp8
    rounding carries wrongly, the GPU's does not): the same bytes and scales as the torch ops,
    an all-zero row included, rows longer than one block, strided rows."""
    from evolm.engine.fast.fp8 import FP8, _quantize_torch
    from evolm.engine.kernels.quant import quantize_rows

    gen = torch.Generator().manual_seed(0)
    q = (torch.randn(6, 5000, generator=gen) * 100).clamp(-447, 447).to(FP8).float()
    q[:, 17] = 448.0
    x = q * 2.0 ** torch.arange(-3, 3).float()[:, None]
    x[4] = 0.0
    x = torch.cat([x, torch.ones(6, 3)], 1)[:, :5000]  # a strided view
    got, scale = quantize_rows(x)
    ref, ref_scale = _quantize_torch(x, dim=1)
    same = torch.equal(got.view(torch.uint8), ref.view(torch.uint8))
    return same and torch.equal(scale, ref_scale) and not x.is_contiguous()


def main(only: str | None = None) -> None:
    """Every check, or with ``only="speculate"`` that one alone (a minute and a half)."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1"
    model = build_model("tiny", torch.device("cpu"), torch.float32, seed=3)
    layout = LoraLayout.from_hf_config(model.config, LoraSpec(rank=3))
    engine = from_model(model, layout, fast=True)
    assert engine.fast is not None
    engine.fast.scheduler.model.set_ops("triton")
    out: dict[str, object] = {"speculate": check_speculate(engine, layout)}
    if only == "speculate":
        print(json.dumps(out))
        return
    check_triton_ops(torch.device("cpu"), torch.float32)
    for prompts in (16, 3):  # rows per member: 16-row kernel programs, or 1-row ones
        out[f"lora_{prompts}"] = check_forced(engine, population(layout, 3), prompts)
        out[f"base_{prompts}"] = check_forced(engine, None, prompts)
    out["spare_rows"] = engine.fast.scheduler.model.layers[0].qkv.weight.shape[0]
    out["slots_equal"] = check_slots(engine, layout)
    # an fp8 KV cache: the RoPE kernel rounds K/V into it, slot attention widens them to fp16
    fp8 = from_model(model, layout, fast=True, kv_cache_dtype="fp8")
    assert fp8.fast is not None
    fp8.fast.scheduler.model.set_ops("triton")
    out["slots_fp8_equal"] = check_slots(fp8, layout)
    out["quantizer_equal"] = check_quantizer()
    # SmolLM2's layout (Llama: no q/k/v bias, tied embeddings, 9 / 3 heads, hidden 288)
    llama = llama_model(smol=True)
    layout = LoraLayout.from_hf_config(llama.config, LoraSpec(rank=3))
    engine = from_model(llama, layout, fast=True)
    assert engine.fast is not None
    engine.fast.scheduler.model.set_ops("triton")
    out["llama_lora"] = check_forced(engine, population(layout, 2), 2)  # kept short: interpreted
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
