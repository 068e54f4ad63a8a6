"""GPU measurements of ``es.mean=full`` (issue 27: (a) fidelity, (b) memory, (c) fold-in cost).

Plain python, no Hydra, random bf16 weights at real shapes (``benchmarks/shapes.py``)::

    python launchers/full_mode_gpu.py --out outputs/full_mode_gpu.json

(a) update fidelity at ``--small-shape`` (first ``--fidelity-layers`` layers, population
    ``--fidelity-population``, the paper's sigma=1e-3, alpha=5e-4): cosine of the fp32
    master's change and of the bf16 working weights' change with ``alpha * grad`` (summed
    member by member in float64), and the share of bf16 entries the update left unchanged;
(b) per rank of ``--ranks`` at ``--big-shape`` and ``--population``: the model (bf16) + the
    fp32 master + every member's factors in bf16 + the fold-in: peak GPU memory of sampling
    and of the fold-in (an OOM is recorded, not raised);
(c) the fold-in (``FullES.tell``) and the working-weight refresh at ``--small-shape`` per rank,
    for populations 30 (W-real's) and ``--population``, as a share of ``--wreal-s`` (a W-real
    generation's seconds, docs/benchmarks.md).

Writes one JSON object to ``--out``. ``--device cpu --big-shape tiny --small-shape tiny``
runs everything in seconds (tests/test_full_mode.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.shapes import build_model
from evolm.engine.fast.weights import update_weights
from evolm.es import ES
from evolm.es.lowrank import FullES, cosine
from evolm.lora import LoraLayout, LoraSpec

log = logging.getLogger("full_mode_gpu")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def setup(
    model: Any, rank: int, es: ES, layers: Sequence[int] | None = None
) -> tuple[FullES, Any, LoraLayout]:
    """The FullES over ``model``'s adapted weights (all 7 projections of ``layers``), and its
    state (the fp32 master, made from the bf16 weights once)."""
    spec = LoraSpec(rank=rank, alpha=2.0 * rank, target_layers=layers)
    layout = LoraLayout.from_hf_config(model.config, spec)
    names = tuple(f"{t.path}.weight" for t in layout.targets)
    strat = FullES.of(es, rank=rank, lora_scaling=layout.scaling, names=names)
    weights = [model.get_parameter(n).detach() for n in names]
    state = strat.init(weights, seed=0)
    return strat, state, layout


def fitness_of(n: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def fidelity(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """(a): the fp32 master's change and the bf16 working copy's change vs alpha * grad."""
    model = build_model(args.small_shape, device, torch.bfloat16)
    es = ES(population_size=args.fidelity_population, sigma=1e-3, alpha=5e-4, mean="full")
    layers = list(range(args.fidelity_layers))
    out: dict[str, Any] = {}
    for rank in args.ranks:
        strat, state, _ = setup(model, rank, es, layers)
        before = [m.clone() for m in state.mean]
        pop = strat.ask(state)
        fitness = fitness_of(len(pop))
        intended = strat.intended_update(state, pop, fitness)
        new, _ = strat.tell(state, pop, fitness)
        master = [a - b for a, b in zip(new.mean, before, strict=True)]
        working = [
            a.bfloat16().double() - b.bfloat16().double()
            for a, b in zip(new.mean, before, strict=True)
        ]
        unchanged = sum(int((w == 0).sum()) for w in working) / sum(w.numel() for w in working)
        out[f"rank{rank}"] = {
            "cosine_master_fp32": cosine(master, intended),
            "cosine_working_bf16": cosine(working, intended),
            "bf16_entries_unchanged": unchanged,
        }
        log.info("(a) rank %d: %s", rank, out[f"rank{rank}"])
    del model
    return {"shape": args.small_shape, "layers": layers, "population": es.population_size, **out}


def memory(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """(b): sampling and fold-in peak memory per rank at the big shape."""
    model = build_model(args.big_shape, device, torch.bfloat16)
    es = ES(population_size=args.population, sigma=1e-3, alpha=5e-4, antithetic=True, mean="full")
    out: dict[str, Any] = {"shape": args.big_shape, "population": args.population}
    for rank in args.ranks:
        row: dict[str, Any] = {}
        try:
            reset_peak(device)
            strat, state, _ = setup(model, rank, es)
            pop = strat.ask(state)
            start = time.perf_counter()
            members = strat.sample(state, pop, dtype=torch.bfloat16)
            sync(device)
            row["sample_s"] = time.perf_counter() - start
            row["members_gib"] = sum(t.nbytes for t in members) / 2**30
            row["peak_after_sample_gib"] = peak_gib(device)
            start = time.perf_counter()
            new, _ = strat.tell(state, pop, fitness_of(len(pop)))
            sync(device)
            row["fold_in_s"] = time.perf_counter() - start
            row["peak_gib"] = peak_gib(device)
            row["oom"] = False
            del members, new
        except torch.OutOfMemoryError as e:
            row |= {"oom": True, "error": str(e).splitlines()[0], "peak_gib": peak_gib(device)}
        state = strat = None  # type: ignore[assignment]
        out[f"rank{rank}"] = row
        log.info("(b) rank %d: %s", rank, row)
    del model
    return out


def fold_in_cost(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """(c): fold-in + working-weight refresh seconds at the small shape vs a W-real generation."""
    model = build_model(args.small_shape, device, torch.bfloat16)
    out: dict[str, Any] = {"shape": args.small_shape, "wreal_s": args.wreal_s}
    for population in sorted({30, args.population}):
        es = ES(population_size=population, sigma=1e-3, alpha=5e-4, mean="full")
        for rank in args.ranks:
            strat, state, _ = setup(model, rank, es)
            pop = strat.ask(state)
            fitness = fitness_of(len(pop))
            sync(device)
            start = time.perf_counter()
            new, _ = strat.tell(state, pop, fitness)
            sync(device)
            fold = time.perf_counter() - start
            start = time.perf_counter()
            update_weights(model, strat.named(new))
            sync(device)
            refresh = time.perf_counter() - start
            row = {
                "fold_in_s": fold,
                "refresh_s": refresh,
                "share_of_wreal": (fold + refresh) / args.wreal_s,
            }
            out[f"pop{population}_rank{rank}"] = row
            log.info("(c) population %d rank %d: %s", population, rank, row)
            del state, new, strat
    del model
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="where the JSON results go")
    p.add_argument("--device", default="cuda")
    p.add_argument("--big-shape", default="qwen2.5-7b")
    p.add_argument("--small-shape", default="qwen2.5-1.5b")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--population", type=int, default=256)
    p.add_argument("--fidelity-layers", type=int, default=2)
    p.add_argument("--fidelity-population", type=int, default=32)
    p.add_argument("--wreal-s", type=float, default=25.0, help="a W-real generation's seconds")
    p.add_argument("--skip", nargs="*", default=[], choices=["a", "b", "c"])
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    device = torch.device(args.device)
    result: dict[str, Any] = {"device": str(device), "torch": torch.__version__}
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
    for key, name, fn in (
        ("a", "fidelity", fidelity),
        ("b", "memory", memory),
        ("c", "fold_in_cost", fold_in_cost),
    ):
        if key not in args.skip:
            result[name] = fn(args, device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(args.out)
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
