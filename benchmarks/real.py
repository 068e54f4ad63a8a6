"""W-real: the workload a user actually runs, side by side on one machine.

``python -m benchmarks --real``: N=30 members x P=200 prompts = 6,000 rows of 128-token
prompts, up to 1,024 new tokens, greedy, rank-4 LoRA on all 7 projections, random bf16 weights
of the Qwen2.5-1.5B / 7B shapes. Two length regimes, forced so every engine generates exactly
the same tokens (EOS ignored, each row its own max_new_tokens):

- ``fixed``: every row 1,024 tokens;
- ``variable``: seeded lognormal lengths, median 300, sigma 0.7, clipped to [16, 1024]
  (6,000 rows: 2,207,011 tokens).

Methods (``--methods``):

- ``continuous``: evolm's local engine, continuous batching (slots from the memory planner at
  ``gpu_memory_utilization`` 0.9, default settings);
- ``continuous_fp8``: the same with ``kv_cache_dtype=fp8`` (an fp8 KV cache: twice the slots,
  half the attention reads; opt-in, lossy);
- ``continuous_w8``: ``quantization=fp8`` (fp8 GEMMs for the projections, W8A8 with dynamic
  per-token scales; opt-in, lossy); ``continuous_w8_fp8``: both fp8 options;
- ``continuous_spec``: ``speculate=4`` (exact speculative decoding in the tail, issue 37: the
  drafts are n-gram lookups in each row's own text, which random weights rarely repeat);
  ``continuous_spec_r540``: the same with ``speculate_rows=540`` (verify steps once at most 540
  rows run). Both opt-in (named in ``--methods``). Each record's ``rows_equal`` counts the rows
  whose tokens equal the first local method's (``continuous``, when named), and
  ``tokens_sha256`` digests them all;
- ``waves``: removed with the lock-step path (continuous batching replaced it; refused here:
  the older tree's ``python -m evolm.bench --real --methods waves`` times it);
- ``sglang``: a real SGLang server (``--sglang-python``, launched here on the same random
  model) with the same rows in ONE ``/generate`` (per-request ``max_new_tokens``,
  ``ignore_eos``), ``max_loras_per_batch`` N+1;
- ``evolm_sglang``: evolm's ``server=sglang`` client against that server, timing its own
  overhead per generation (adapter writes, load / unload, request building).

Each record: seconds, generated tokens, tokens/s, peak device memory, and the floor (GEMM
FLOPs at the dense bf16 rate and KV-cache reads at HBM bandwidth, whichever is larger).

``--ranks K`` (local methods) also times each of the K shards of the generation, one after
another on this one device, after the whole population (warm: the same workspace and graphs):
what each rank of ``torchrun --nproc_per_node=K -m evolm`` generates. ``--shard interleaved``:
rows ``r, r + K, ...`` (what ``evolm.dist`` does); ``--shard balanced``: rows split by exact
work (:func:`balanced`, each row's budget as its cost, each shard longest first: the best a
scheduler that knew every length could do); ``--shard interleaved,balanced``: both,
on the same warm engine. Recorded under ``shards.<mode>``: per shard seconds, tokens and decode
steps, the slowest shard, and ``speedup`` = the whole population's seconds / the slowest
shard's (the K-GPU speed-up, all-gather aside).

The local methods use the engine's public API only: one :class:`LocalEngine` over the model,
a sibling per method (:meth:`LocalEngine.with_options`: the fp8 options), rows of any members
with per-row budgets through :func:`benchmarks.harness.generate_ids`.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import logging
import math
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import from_model, generate_ids, with_options
from benchmarks.methods import Workload, sample_population
from benchmarks.roofline import Dims, device_peaks
from benchmarks.shapes import build_model, save_model
from evolm.engine.local import LocalEngine
from evolm.engine.options import DTYPES
from evolm.lora import LoraLayout, LoraPopulation, LoraSpec
from evolm.sampling import Sampling

log = logging.getLogger(__name__)

MEDIAN, SIGMA, LOW = 300, 0.7, 16

LOCAL = {  # evolm's local methods: their LocalOptions beyond the defaults
    "continuous": {},
    "continuous_fp8": {"kv_cache_dtype": "fp8"},
    "continuous_w8": {"quantization": "fp8"},
    "continuous_w8_fp8": {"kv_cache_dtype": "fp8", "quantization": "fp8"},
    "continuous_spec": {"speculate": 4},
    "continuous_spec_r540": {"speculate": 4, "speculate_rows": 540},
}
REMOVED = {"waves": "the lock-step waves path was removed (continuous batching replaced it)"}


@dataclass(frozen=True)
class Sizes:
    """The workload's sizes (W-real by default; smaller for a CPU smoke run)."""

    members: int = 30
    prompts: int = 200
    prompt_len: int = 128
    max_new: int = 1024

    @property
    def rows(self) -> int:
        return self.members * self.prompts


MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lengths(regime: str, rows: int, max_new: int = 1024, seed: int = 0) -> list[int]:
    """Each row's forced completion length."""
    if regime == "fixed":
        return [max_new] * rows
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, generator=gen, dtype=torch.float64)
    median = MEDIAN * max_new / 1024
    x = (median * torch.exp(SIGMA * z)).round().clamp(min(LOW, max_new), max_new)
    return [int(v) for v in x.tolist()]


def floor_s(
    dims: Dims, budgets: list[int], rank: int, prompt_len: int, device: torch.device
) -> dict[str, float]:
    """Lower bounds: all GEMM FLOPs at the dense rate, all KV-cache reads at HBM bandwidth."""
    peaks = device_peaks(device)
    if peaks is None:
        return {}
    _, flops_s, bw = peaks
    proj = dims.layers * (dims.layer_params + dims.lora_params(rank))
    head = dims.vocab * dims.hidden
    tokens = sum(budgets)
    rows = len(budgets)
    flops = 2 * (proj + head) * tokens + 2 * proj * rows * prompt_len
    kv = dims.kv_bytes_per_token(2)
    reads = sum(n * prompt_len + n * (n - 1) / 2 for n in budgets) * kv
    compute, memory = flops / flops_s, reads / bw
    return {"compute_s": compute, "kv_read_s": memory, "floor_s": max(compute, memory)}


def _peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0


def run_local(
    engine: LocalEngine,
    ids: torch.Tensor,
    pop: LoraPopulation,
    budgets: list[int],
    share: list[int] | None = None,
    reference: dict[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """One generation of all rows (member-major: row ``i`` is member ``i // P``, prompt
    ``i % P``; or the rows ``share``, in its order) on the local engine; its timing and
    memory. ``reference``: the generated ids by regime key (``"ids"``): filled by the first
    call, and each later call's record counts the rows equal to it (``rows_equal``)."""
    device = engine.device
    members, prompts = len(pop), ids.shape[0]
    share = list(range(members * prompts)) if share is None else share
    index = torch.tensor(share, dtype=torch.long, device=device)
    rows = ids[index % prompts]
    mask = torch.ones_like(rows)
    member = index // prompts
    budgets = [budgets[i] for i in share]
    sampling = Sampling(max_new_tokens=max(budgets))
    _peak_reset(device)
    start = time.perf_counter()
    out = generate_ids(
        engine, rows, mask, pop, sampling, member=member, budgets=budgets, eos_ids=[]
    )
    assert out.shape == (len(budgets), max(budgets))
    generated = sum(budgets)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    tokens = out.cpu()  # after the clock
    rec: dict[str, Any] = {
        "seconds": seconds,
        "tokens": generated,
        "tokens_per_s": generated / seconds,
        "peak_gib": _peak(device),
        "tokens_sha256": hashlib.sha256(tokens.numpy().tobytes()).hexdigest(),
    }
    if reference is not None:  # rows equal to the first method's (exact methods: all)
        first = reference.setdefault("ids", tokens)
        rec["rows_equal"] = int((tokens == first).all(dim=1).sum())
    plan = None if engine.fast is None else engine.fast.scheduler.plan
    if plan is not None:
        rec.update(
            slots=plan.slots,
            budget_gib=engine.options.gpu_memory_utilization * plan.total / 2**30,  # peak below
            plan=plan.describe(),
            timings=engine.last_timings,
        )
    return rec


SHARD_MODES = ("interleaved", "balanced")


def balanced(costs: list[float], ranks: int) -> list[list[int]]:
    """Items of work ``costs`` over ``ranks`` (LPT greedy): largest first, each to the least
    loaded rank (ties: the lowest); each rank's list largest first. Loads end within one item's
    cost of each other."""
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    parts: list[list[int]] = [[] for _ in range(ranks)]
    loads = [(0.0, r) for r in range(ranks)]  # a heap of (load, rank)
    for i in order:
        load, r = heapq.heappop(loads)
        parts[r].append(i)
        heapq.heappush(loads, (load + costs[i], r))
    return parts


def shards(rows: int, budgets: list[int], ranks: int, mode: str) -> list[list[int]]:
    """The K ranks' rows: interleaved (``r, r + K, ...``) or balanced by budget."""
    if mode == "interleaved":
        return [list(range(r, rows, ranks)) for r in range(ranks)]
    if mode == "balanced":
        return balanced([float(b) for b in budgets], ranks)
    raise ValueError(f"--shard: interleaved or balanced, got {mode!r}")


def run_shards(
    engine: LocalEngine,
    ids: torch.Tensor,
    pop: LoraPopulation,
    budgets: list[int],
    ranks: int,
    mode: str,
    whole_s: float,
) -> dict[str, Any]:
    """Each of the ``ranks`` shards of the rows, one after another; the slowest one and the
    speed-up over the whole population's ``whole_s``."""
    per: list[dict[str, Any]] = []
    for r, share in enumerate(shards(len(budgets), budgets, ranks, mode)):
        rec = run_local(engine, ids, pop, budgets, share)
        steps = rec.get("timings", {}).get("steps")
        per.append({"rank": r, "rows": len(share), "seconds": rec["seconds"],
                    "tokens": rec["tokens"], "steps": steps})  # fmt: skip
        log.info("shard %d of %d (%s): %s", r, ranks, mode, per[-1])
    slowest = max(per, key=lambda s: s["seconds"])
    return {
        "mode": mode,
        "ranks": ranks,
        "per_shard": per,
        "slowest_rank": slowest["rank"],
        "slowest_s": slowest["seconds"],
        "whole_s": whole_s,
        "speedup": whole_s / slowest["seconds"],
    }


# -- SGLang --------------------------------------------------------------------------------
def _post(url: str, body: dict[str, Any], timeout: float = 1800) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{url} -> {e.code}: {e.read()[:2000]!r}") from e


def write_adapters(pop: LoraPopulation, folder: Path, dtype: torch.dtype) -> list[Path]:
    """Every member as a PEFT adapter directory (the server's dtype)."""
    from evolm.lora.peft_io import save_adapter

    return [
        save_adapter(folder / f"m{i}", pop.layout, pop.member(i), "bench", dtype=dtype)
        for i in range(len(pop))
    ]


class SGLangServer:
    """An SGLang server on ``model_dir`` (launched with ``python``), LoRA on, N+1 slots."""

    def __init__(
        self,
        python: str,
        model_dir: Path,
        rank: int,
        slots: int,
        port: int = 30011,
        tokenizer: bool = False,
    ) -> None:
        self.url = f"http://127.0.0.1:{port}"
        skip = [] if tokenizer else ["--skip-tokenizer-init"]  # evolm's client sends text
        cmd = [
            python, "-m", "sglang.launch_server", "--model-path", str(model_dir), *skip,
            "--host", "127.0.0.1", "--port", str(port),
            "--enable-lora", "--max-lora-rank", str(rank), "--lora-target-modules", *MODULES,
            "--max-loras-per-batch", str(slots), "--attention-backend", "triton",
            "--sampling-backend", "pytorch",
        ]  # fmt: skip
        self.log_path = Path(tempfile.gettempdir()) / "sglang-bench.log"
        self.log = self.log_path.open("w")
        start = time.time()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("sglang died:\n" + self.log_path.read_text()[-3000:])
            try:
                urllib.request.urlopen(f"{self.url}/health", timeout=5)
                break
            except Exception:
                if time.time() - start > 400:
                    raise RuntimeError("sglang: no /health in 400 s") from None
                time.sleep(2)
        self.startup_s = time.time() - start

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def run_sglang(
    server: SGLangServer, ids: torch.Tensor, adapters: list[Path], budgets: list[int]
) -> dict[str, Any]:
    """Load the adapters, then ONE /generate of every row (per-row max_new_tokens)."""
    names = [f"m{i}" for i in range(len(adapters))]
    t = time.perf_counter()
    for name, path in zip(names, adapters, strict=True):
        r = _post(f"{server.url}/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        assert r.get("success", True), r
    load_s = time.perf_counter() - t
    prompts = ids.tolist()
    rows = [p for _ in names for p in prompts]
    lora = [n for n in names for _ in prompts]
    params = [{"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True} for n in budgets]
    warm = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
    _post(f"{server.url}/generate", {"input_ids": rows[:64], "sampling_params": warm,
                                     "lora_path": lora[:64]})  # fmt: skip
    t = time.perf_counter()
    out = _post(
        f"{server.url}/generate", {"input_ids": rows, "sampling_params": params, "lora_path": lora}
    )
    seconds = time.perf_counter() - t
    generated = sum(len(o["output_ids"]) for o in out)
    for name in names:
        _post(f"{server.url}/unload_lora_adapter", {"lora_name": name})
    free, total = torch.cuda.mem_get_info()
    return {
        "seconds": seconds,
        "tokens": generated,
        "tokens_per_s": generated / seconds,
        "device_used_gib": (total - free) / 2**30,
        "load_adapters_s": load_s,
        "startup_s": server.startup_s,
    }


def run_evolm_sglang(
    server: SGLangServer, model_dir: Path, pop: LoraPopulation, ids: torch.Tensor, max_new: int
) -> dict[str, Any]:
    """evolm's ``server=sglang`` engine for one generation: its overhead around /generate."""
    from evolm.server.options import RemoteOptions
    from evolm.server.sglang import SGLangEngine

    engine = SGLangEngine(
        str(model_dir),
        pop.layout,
        RemoteOptions("sglang.launch_server", url=server.url, self_test=False),
        max_loras_per_batch=len(pop) + 1,  # what server=sglang now defaults to
    )
    tok = engine.tokenizer
    texts = tok.batch_decode((ids % len(tok)).tolist(), skip_special_tokens=True)
    sampling = Sampling(max_new_tokens=max_new)
    engine.generate(texts, pop, sampling, seed=0)  # warm
    t = time.perf_counter()
    engine.generate(texts, pop, sampling, seed=0)
    seconds = time.perf_counter() - t
    timings = dict(engine.last_timings)
    engine.close()
    return {"seconds": seconds, "timings": timings}


# -- driver --------------------------------------------------------------------------------
def run(
    shape: str,
    methods: list[str],
    regimes: list[str],
    device: torch.device,
    sglang_python: str | None = None,
    out: Path | None = None,
    sizes: Sizes = Sizes(),
    ranks: int = 1,
    shard: str | list[str] = "interleaved",
) -> dict[str, Any]:
    """Every (method, regime) of one shape; the record (also written to ``out`` as it grows).
    ``ranks`` > 1: each local method's shards too (:func:`run_shards`, ``shard`` their modes)."""
    modes = [shard] if isinstance(shard, str) else list(shard)
    dtype = DTYPES["bfloat16"] if device.type == "cuda" else DTYPES["float32"]
    work = Workload(shape=shape, members=sizes.members, prompts=sizes.prompts,
                    prompt_len=sizes.prompt_len, new_tokens=sizes.max_new, rank=4,
                    dtype=str(dtype).removeprefix("torch."))  # fmt: skip
    model = build_model(shape, device, dtype, seed=0)
    dims = Dims.from_config(model.config)
    layout = LoraLayout.from_hf_config(model.config, LoraSpec(rank=4))
    engine = from_model(model, layout, fast=True)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    shape_ids = (sizes.prompts, sizes.prompt_len)
    ids = torch.randint(vocab // 8, vocab, shape_ids, generator=gen).to(device)
    pop, _ = sample_population(work, engine)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    record: dict[str, Any] = {
        "machine": name,
        "torch": torch.__version__,
        "shape": shape,
        "rows": sizes.rows,
        "members": sizes.members,
        "prompt_len": sizes.prompt_len,
        "max_new_tokens": sizes.max_new,
        "results": {},
    }

    def save() -> None:
        if out is not None:
            out.write_text(json.dumps(record, indent=2))

    for regime in regimes:
        budgets = lengths(regime, sizes.rows, sizes.max_new)
        record["results"].setdefault(regime, {})["tokens"] = sum(budgets)
        record["results"][regime]["floor"] = floor_s(dims, budgets, 4, sizes.prompt_len, device)
    for method in methods:
        if method in REMOVED:
            log.error("%s: %s", method, REMOVED[method])
            for regime in regimes:
                record["results"][regime][method] = {"error": REMOVED[method]}
    firsts: dict[str, dict[str, torch.Tensor]] = {r: {} for r in regimes}  # the first method's
    for method, settings in LOCAL.items():
        if method not in methods:
            continue
        engine.close()  # the other method's buffers go first
        local = with_options(engine, **settings)
        # the first regime again at the end, warm (its first run captured graphs)
        again = regimes[:1]
        for i, regime in enumerate([*regimes, *again]):
            budgets = lengths(regime, sizes.rows, sizes.max_new)
            log.info("%s %s: %s", shape, regime, method)
            try:
                rec = run_local(local, ids, pop, budgets, reference=firsts[regime])
            except Exception as e:  # one method's failure must not lose the others
                log.exception("%s failed", method)
                rec = {"error": repr(e)[:2000]}
            old = record["results"][regime].get(method)
            if i >= len(regimes) and old is not None and "seconds" in old and "seconds" in rec:
                rec["cold_seconds"] = old["seconds"]  # the first run, graphs captured in it
            record["results"][regime][method] = rec
            log.info("%s %s %s: %s", shape, regime, method, rec)
            save()
        for regime in regimes if ranks > 1 else []:  # warm: after every regime's whole run
            rec = record["results"][regime][method]
            if "seconds" not in rec:
                continue
            budgets = lengths(regime, sizes.rows, sizes.max_new)
            for mode in modes:
                try:
                    got = run_shards(local, ids, pop, budgets, ranks, mode, rec["seconds"])
                except Exception as e:
                    log.exception("%s %s shards failed", method, mode)
                    got = {"error": repr(e)[:2000]}
                rec.setdefault("shards", {})[mode] = got
                save()
        local.close()
        del local
    if "sglang" in methods or "evolm_sglang" in methods:
        folder = Path(tempfile.mkdtemp(prefix="bench-sglang-"))
        model_dir = save_model(model, folder / "model")
        adapters = write_adapters(pop, folder / "adapters", dtype)
        del engine, model
        if device.type == "cuda":
            torch.cuda.empty_cache()
        server = None
        try:
            server = SGLangServer(
                sglang_python or "python3",
                model_dir,
                4,
                sizes.members + 1,
                tokenizer="sglang" not in methods,  # evolm_sglang alone: text prompts
            )
            for regime in regimes:
                if "sglang" in methods:
                    budgets = lengths(regime, sizes.rows, sizes.max_new)
                    log.info("%s %s: sglang", shape, regime)
                    rec = run_sglang(server, ids.cpu(), adapters, budgets)
                    record["results"][regime]["sglang"] = rec
                    log.info("%s %s sglang: %s", shape, regime, rec)
                    save()
            if "evolm_sglang" in methods:
                rec = run_evolm_sglang(server, model_dir, pop, ids.cpu(), 64)
                record["evolm_sglang_overhead"] = rec
                save()
        except Exception as e:
            log.exception("sglang failed")
            record["sglang_error"] = repr(e)[:3000]
            save()
        finally:
            if server is not None:
                server.close()
            shutil.rmtree(folder, ignore_errors=True)
    return record


def markdown(records: list[dict[str, Any]]) -> str:
    """One table row per (shape, regime, method)."""
    lines = [
        "| shape | regime | method | s / generation | tokens | tokens/s | peak GiB | floor s "
        "| rows as the first method's |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for rec in records:
        for regime, res in rec["results"].items():
            fl = res.get("floor", {}).get("floor_s", math.nan)
            for method in (*LOCAL, *REMOVED, "sglang"):
                r = res.get(method)
                if r is None:
                    continue
                if "error" in r:
                    lines.append(f"| {rec['shape']} | {regime} | {method} | error | | | | | |")
                    continue
                peak = r.get("peak_gib") or r.get("device_used_gib", math.nan)
                lines.append(
                    f"| {rec['shape']} | {regime} | {method} | {r['seconds']:.1f} | "
                    f"{r['tokens']:,} | {r['tokens_per_s']:,.0f} | {peak:.1f} | {fl:.1f} | "
                    f"{r.get('rows_equal', '')} |"
                )
    sharded = [
        (rec["shape"], regime, method, sh)
        for rec in records
        for regime, res in rec["results"].items()
        for method, r in res.items()
        if isinstance(r, dict)
        for sh in r.get("shards", {}).values()
        if "speedup" in sh
    ]
    if sharded:
        lines += [
            "",
            "| shape | regime | method | shards | per-shard s | per-shard tokens | slowest s "
            "| speed-up |",
            "|---|---|---|---|---|---|---:|---:|",
        ]
        for shape, regime, method, sh in sharded:
            secs = " / ".join(f"{s['seconds']:.2f}" for s in sh["per_shard"])
            toks = " / ".join(f"{s['tokens']:,}" for s in sh["per_shard"])
            lines.append(
                f"| {shape} | {regime} | {method} | {sh['ranks']} {sh['mode']} | {secs} | "
                f"{toks} | {sh['slowest_s']:.2f} | {sh['speedup']:.2f}x |"
            )
    return "\n".join(lines)


def main(args: Any, device: torch.device) -> int:
    methods = [m.strip() for m in args.methods.split(",")]
    regimes = [r.strip() for r in args.regimes.split(",")]
    modes = [m.strip() for m in args.shard.split(",")]
    unknown = sorted(set(modes) - set(SHARD_MODES))
    if unknown:
        raise SystemExit(f"--shard: unknown {unknown}; choose from {','.join(SHARD_MODES)}")
    records = []
    sizes = Sizes(
        members=args.members or 30,
        prompts=args.prompts or 200,
        prompt_len=args.prompt_len or 128,
        max_new=args.new_tokens or 1024,
    )
    for shape in args.shape or ["qwen2.5-1.5b"]:
        path = Path(args.json) if args.json else None
        if path is not None and len(args.shape or []) > 1:
            path = path.with_name(f"{path.stem}-{shape}{path.suffix}")
        records.append(
            run(
                shape,
                methods,
                regimes,
                device,
                args.sglang_python,
                path,
                sizes,
                args.ranks,
                modes,
            )
        )
        if device.type == "cuda":
            torch.cuda.empty_cache()
    table = markdown(records)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    print(table)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":  # python -m benchmarks.real ...: python -m benchmarks --real ...
    from benchmarks.__main__ import main as bench_main

    sys.exit(bench_main(["--real", *sys.argv[1:]]))
