"""``python -m benchmarks.tune``: the fast path's settings side by side, and where time goes.

    python -m benchmarks.tune --shape qwen2.5-7b --variant pad=1,ops=eager --variant pad=8 \\
        --profile --json out.json

Builds the model once; for each variant (``pad`` = LoRA rank-column padding, ``ops`` =
eager / compile / triton, ``prefill`` = tokens per prefill chunk, ``sdpa`` = decode attention
backend) times (a) evolm and (b) base on the workload (one warm-up, ``--reps`` runs).
``--profile`` adds the top GPU kernels of a prefill-only generation and of a whole one (graphs
off: the same kernels, listed one by one).

A kernel benchmark: it picks the fast forward's kernels (``ops``, ``sdpa``) on the engine's
fast model; the rest goes through the engine's public API (:class:`Tuning` knobs).
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from benchmarks import methods as M
from benchmarks.harness import from_model, generate_ids, with_options
from benchmarks.shapes import SHAPES, build_model
from evolm.engine.local import LocalEngine
from evolm.engine.options import DTYPES, Tuning
from evolm.lora import LoraLayout, LoraPopulation, LoraSpec
from evolm.sampling import Sampling

log = logging.getLogger("benchmarks.tune")


def apply(engine: LocalEngine, variant: dict[str, str]) -> LocalEngine:
    """An engine over the same model with ``variant``'s knobs; kernel choice (``ops``,
    ``sdpa``) is set on the shared fast forward (this is a kernel benchmark)."""
    engine.close()  # the previous variant's buffers first
    pad = int(variant.get("pad", 8))  # (triton ops: at least 16, a power of 2)
    prefill = int(variant["prefill"]) if "prefill" in variant else None
    tuned = with_options(engine, tuning=Tuning(prefill_tokens=prefill, lora_pad=pad))
    assert tuned.fast is not None
    tuned.fast.scheduler.model.set_ops(variant.get("ops", "triton"))
    tuned.fast.scheduler.model.decode_sdpa = variant.get("sdpa") or None
    return tuned


def kernels(prof: Any, per: int, top: int = 12) -> list[dict[str, Any]]:
    rows = []
    for evt in prof.key_averages():
        t = getattr(evt, "self_device_time_total", 0) or getattr(evt, "self_cuda_time_total", 0)
        if t > 0 and not evt.key.startswith("aten::"):
            rows.append({"name": evt.key[:80], "calls": evt.count / per, "us": t / per})
    rows.sort(key=lambda r: -r["us"])
    return rows[:top]


def profile_slots(
    engine: LocalEngine, ids: torch.Tensor, pop: LoraPopulation | None, work: M.Workload
) -> dict[str, Any]:
    """Continuous batching (what users run), graphs off: the GPU kernels of a prefill-only
    generation (one new token) and of a whole one; ``pop`` None: the base model.
    Also the host time of loading ``pop`` into the engine's buffers."""
    import time

    from torch.profiler import ProfilerActivity, profile

    def sync() -> None:
        if engine.device.type == "cuda":
            torch.cuda.synchronize()

    rows = ids.repeat(work.members, 1)
    mask = torch.ones_like(rows)
    out: dict[str, Any] = {}
    acts = [ProfilerActivity.CUDA if engine.device.type == "cuda" else ProfilerActivity.CPU]
    engine.close()
    eager = with_options(engine, tuning=replace(engine.tuning, cuda_graphs=False))
    try:
        for name, new in (("prefill", 1), ("whole", work.new_tokens)):
            sampling = Sampling(max_new_tokens=new)
            generate_ids(eager, rows, mask, pop, sampling, eos_ids=[])  # warm
            sync()
            with profile(activities=acts) as prof:
                generate_ids(eager, rows, mask, pop, sampling, eos_ids=[])
                sync()
            out[name] = kernels(prof, 1, 24)
    finally:
        eager.close()
    if pop is not None:
        times = []
        for _ in range(5):
            sync()
            t0 = time.perf_counter()
            engine.fast.load_lora(pop)
            t1 = time.perf_counter()
            sync()
            times.append((t1 - t0, time.perf_counter() - t0))
        out["load_host_s, load_s"] = times
    return out


def run(work: M.Workload, variants: list[dict[str, str]], reps: int, prof: bool) -> dict:
    device = torch.device("cuda")
    model = build_model(work.shape, device, DTYPES[work.dtype], seed=work.seed)
    layout = LoraLayout.from_hf_config(model.config, LoraSpec(rank=work.rank))
    engine = from_model(model, layout, fast=True)
    ids = torch.randint(1000, 100000, (work.prompts, work.prompt_len), device=device)
    pop, book = M.sample_population(work, engine)
    out: dict[str, Any] = {"shape": work.shape, "bookkeeping": book, "variants": []}
    for variant in variants:
        engine = apply(engine, variant)
        a = M.time_engine(engine, ids, pop, work, reps).as_dict()
        b = M.time_engine(engine, ids, None, work, reps).as_dict()
        row = {
            "variant": variant,
            "evolm": a,
            "base": b,
            "overhead": a["seconds"] / b["seconds"] - 1,
        }
        out["variants"].append(row)
        log.info(
            "%s %s: evolm %.3f s (prefill %.3f, %.2f ms/step, first %.1f s), base %.3f s, "
            "overhead %.1f%%, peak %.2f GiB",
            *(work.shape, variant, a["seconds"], a["prefill_s"], a["decode_ms_per_step"]),
            *(a["first_call_s"], b["seconds"], 100 * row["overhead"]),
            a["peak_memory_bytes"] / 2**30,
        )
    if prof:
        out["slots"] = profile_slots(engine, ids, pop, work)
        out["slots_base"] = profile_slots(engine, ids, None, work)
        for key in ("slots", "slots_base"):
            for phase in ("prefill", "whole"):
                table = out[key][phase]
                lines = (f"  {r['us']:9.1f} us  {r['calls']:6.1f}x  {r['name']}" for r in table)
                log.info("%s %s %s:\n%s", work.shape, key, phase, "\n".join(lines))
    return out


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    p = argparse.ArgumentParser(prog="python -m benchmarks.tune")
    p.add_argument("--shape", action="append", choices=sorted(SHAPES))
    p.add_argument("--variant", action="append", default=[], help="k=v,k=v (repeatable)")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--json")
    args = p.parse_args(argv)
    variants = [dict(kv.split("=") for kv in v.split(",") if kv) for v in args.variant or [""]]
    results = []
    for shape in args.shape or ["qwen2.5-0.5b"]:
        results.append(run(M.Workload(shape=shape), variants, args.reps, args.profile))
        torch.cuda.empty_cache()
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
