"""One benchmark record per workload: build the model, time every method, add the context.

The record (JSON-ready) holds the machine, the workload, each method's timing, the ratios the
targets are stated in, ES bookkeeping, peak memory against what the batch needs, the roofline
floor, a fast-vs-HF logit check, and optionally the top GPU kernels of one evolm run.
"""

from __future__ import annotations

import logging
import platform
import tempfile
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

import torch
import transformers

from benchmarks import methods as M
from benchmarks.harness import from_model, generate_ids, with_options
from benchmarks.roofline import Dims, device_peaks, floor
from benchmarks.shapes import build_model, param_bytes
from evolm.engine.local import LocalEngine
from evolm.engine.options import DTYPES, Tuning
from evolm.lora import LoraLayout, LoraPopulation, LoraSpec
from evolm.sampling import Sampling

log = logging.getLogger(__name__)

METHODS = (
    "evolm",
    "base",
    "evolm_fp8",
    "base_fp8",
    "paper",
    "paper_fast",
    "hf_lora",
    "external",
)
DEFAULT_METHODS = tuple(m for m in METHODS if not m.endswith("_fp8"))  # fp8: opt-in (Hopper)


def machine(device: torch.device) -> dict[str, Any]:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return {
        "device": name or platform.machine(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def run_workload(
    work: M.Workload,
    device: torch.device,
    methods: tuple[str, ...],
    reps: int = 3,
    baseline_members: int = 3,
    runner: M.Runner | None = None,
    profile: bool = False,
    tuning: Tuning | None = None,
) -> dict[str, Any]:
    """Time ``methods`` on ``work``; see the module docstring for the record. ``tuning``: the
    fast path's benchmark knobs (:class:`~evolm.engine.options.Tuning`)."""
    dtype = DTYPES[work.dtype]
    model = build_model(work.shape, device, dtype, seed=work.seed)
    layout = LoraLayout.from_hf_config(model.config, LoraSpec(rank=work.rank))
    tuning = tuning or Tuning()
    engine = from_model(model, layout, fast=True, tuning=tuning)
    gen = torch.Generator().manual_seed(work.seed)
    vocab = model.config.vocab_size
    ids = torch.randint(vocab // 8, vocab, (work.prompts, work.prompt_len), generator=gen)
    ids = ids.to(device)
    pop, book = M.sample_population(work, engine)
    results: dict[str, dict[str, Any]] = {}
    k = min(baseline_members, work.members)

    def quantized(run: Callable[[LocalEngine], M.Timing]) -> M.Timing:
        """``run`` on an engine with ``server.quantization=fp8`` (fp8 projection GEMMs) over
        the same model; its buffers go after."""
        engine.close()  # the bf16 buffers first
        fp8 = with_options(engine, quantization="fp8")
        try:
            return run(fp8)
        finally:
            fp8.close()

    steps = {
        "evolm": lambda: M.time_engine(engine, ids, pop, work, reps),
        "base": lambda: M.time_engine(engine, ids, None, work, reps),
        "paper_fast": lambda: M.time_paper(engine, ids, work, k, fast=True),
        "paper": lambda: M.time_paper(engine, ids, work, k, fast=False),
        "hf_lora": lambda: M.time_hf_lora(engine, ids, pop, work, k),
        "external": lambda: M.time_external(runner, ids, pop, work, reps),  # type: ignore[arg-type]
    }
    steps["evolm_fp8"] = lambda: quantized(lambda e: M.time_engine(e, ids, pop, work, reps))
    steps["base_fp8"] = lambda: quantized(lambda e: M.time_engine(e, ids, None, work, reps))
    for name in METHODS:
        if name in methods and (name != "external" or runner is not None):
            log.info("%s: timing %s", work.shape, name)
            results[name] = steps[name]().as_dict()
            log.info("%s: %s %.3f s", work.shape, name, results[name]["seconds"])
    with tempfile.TemporaryDirectory() as folder:
        book["adapter_write_s"] = M.time_adapter_writes(pop, folder, work.shape)
    record = {
        "machine": machine(device),
        "workload": asdict(work),
        "results": results,
        "bookkeeping": book,
        "ratios": ratios(results, book),
        "memory": memory(engine, work, results.get("evolm", {})),
        "roofline": roofline(model, work, device),
        "check": check_against_hf(engine, pop, ids),
        "fast_options": {k: v for k, v in asdict(tuning).items() if v is not None},
    }
    if profile:
        record["profile"] = profile_kernels(engine, ids, pop, work)
    return record


def ratios(results: dict[str, dict[str, Any]], book: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    a = results.get("evolm", {}).get("seconds")
    if not a:
        return out
    if "base" in results:
        out["lora_overhead"] = a / results["base"]["seconds"] - 1
    a8 = results.get("evolm_fp8", {}).get("seconds")
    if a8 and "base_fp8" in results:
        out["lora_overhead_fp8"] = a8 / results["base_fp8"]["seconds"] - 1
    if a8:
        out["fp8_speedup"] = a / a8
    for name in ("paper", "paper_fast", "hf_lora", "external"):
        if name in results:
            out[f"{name}_over_evolm"] = results[name]["seconds"] / a
    spent = book["sample_s"] + book["tell_s"] + book.get("engine_load_s", 0.0)
    out["bookkeeping_share"] = spent / a
    return out


def memory(engine: LocalEngine, work: M.Workload, evolm: dict[str, Any]) -> dict[str, float]:
    """Peak allocated during the evolm runs vs weights + the batch's KV cache + adapters."""
    dims = Dims.from_config(engine.model.config)
    item = torch.finfo(engine.dtype).bits // 8
    weights = param_bytes(engine.model)
    kv = work.rows * (work.prompt_len + work.new_tokens) * dims.kv_bytes_per_token(item)
    adapters = work.members * engine.layout.numel() * item
    need = weights + kv + adapters
    out = {"weights_bytes": weights, "kv_cache_bytes": kv, "adapter_bytes": adapters}
    out["needed_bytes"] = need
    if "peak_memory_bytes" in evolm:
        out["peak_bytes"] = evolm["peak_memory_bytes"]
        out["peak_over_needed"] = evolm["peak_memory_bytes"] / need
    return out


def roofline(model: Any, work: M.Workload, device: torch.device) -> dict[str, Any]:
    peaks = device_peaks(device)
    if peaks is None:
        return {}
    name, flops, bw = peaks
    dims = Dims.from_config(model.config)
    result = floor(dims, work.rows, work.prompt_len, work.new_tokens, work.rank, flops, bw)
    return {"device": name, "peak_flops": flops, "bandwidth": bw, **result}


def check_against_hf(
    engine: LocalEngine, pop: LoraPopulation, ids: torch.Tensor
) -> dict[str, float]:
    """Fast path vs the HF path's model (MultiLoraLinear) on 2 members x 2 prompts, 4 forced
    tokens: teacher-forced logits of the fast path against those the HF path scores KL with."""
    few = LoraPopulation(pop.layout, tuple(t[:2] for t in pop.tensors))
    prompts = ids[:2, :16]
    rows = prompts.repeat(2, 1)
    forced = torch.randint(0, engine.model.config.vocab_size, (4, 4), device=ids.device)
    mask = torch.ones_like(rows)
    assert engine.fast is not None, "forced logits are the fast path's"
    with torch.inference_mode():
        ours = engine.fast.forced_logits(rows, mask, few, forced).float()
    ref = M.hf_forced_logits(engine, few, torch.cat([rows, forced], dim=1), rows.shape[1])
    return {
        "max_abs_diff": (ours - ref).abs().max().item(),
        "ref_max_abs": ref.abs().max().item(),
        "argmax_agree": (ours.argmax(-1) == ref.argmax(-1)).float().mean().item(),
    }


def profile_kernels(
    engine: LocalEngine, ids: torch.Tensor, pop: LoraPopulation, work: M.Workload, top: int = 15
) -> list[dict[str, Any]]:
    """Top device kernels of one evolm run (at most 32 new tokens) with graphs off: the same
    kernels as with graphs, visible one by one."""
    from torch.profiler import ProfilerActivity, profile

    rows = ids.repeat(work.members, 1)
    sampling = Sampling(max_new_tokens=min(work.new_tokens, 32))
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ids.is_cuda else [])
    engine.close()
    eager = with_options(engine, tuning=replace(engine.tuning, cuda_graphs=False))

    def run() -> torch.Tensor:
        return generate_ids(eager, rows, torch.ones_like(rows), pop, sampling, eos_ids=[])

    try:
        run()
        with profile(activities=acts) as prof:
            M.timed(engine.device, run)
    finally:
        eager.close()
    kernels = []
    for evt in prof.key_averages():
        t = getattr(evt, "self_device_time_total", 0) or getattr(evt, "self_cuda_time_total", 0)
        if t > 0:
            kernels.append({"name": evt.key[:90], "count": evt.count, "device_ms": t / 1e3})
    kernels.sort(key=lambda r: -r["device_ms"])
    return kernels[:top]
