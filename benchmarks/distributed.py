"""``python -m benchmarks.distributed``: what one distributed ES generation costs per rank, and
the speedup it projects for 2, 4 and 8 GPUs.

    python -m benchmarks.distributed                          # 1 process (CPU: tiny shape)
    torchrun --nproc_per_node=2 -m benchmarks.distributed     # 2 ranks (gloo on CPU, NCCL on GPU)
    torchrun --nproc_per_node=2 -m benchmarks.distributed --shape qwen2.5-1.5b --members 30 \\
        --prompts 200 --prompt-len 128 --new-tokens 1024 --json docs/bench/dist-2gpu.json

Every rank builds the random-weight model of ``--shape`` on its device (``cuda:LOCAL_RANK``),
samples the same population, and measures, warm (median of ``--reps``):

- ``alone_s``: the whole population's rows on this rank alone (the one-GPU generation);
- ``shard_s[K]``: the rows one rank of K generates (``rows[0::K]``, the split :mod:`evolm.dist`
  uses), on this one device: the per-rank generation time K GPUs would have;
- ``generation_s``: the real distributed generation over this run's W ranks: my shard, one
  all-gather of per-row scores, the ES tell, the checksum of the mean (slowest rank);
- ``gather_s`` and ``check_s``: the all-gather of W shares of per-row scores and the
  checksum all-gather alone (after a barrier: communication, not waiting).

Projection for K GPUs: ``alone_s / (shard_s[K] + gather(K) + tell_s + check_s)``, with the
all-gather cost growing linearly in K from the measured one (ring all-gather; 0 when W = 1).
Generation is per-rank independent (no communication inside it), so this is the speedup up to
GPU-to-GPU variation; the measured W-rank speedup is ``alone_s / generation_s``.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import from_model, generate_ids
from benchmarks.methods import Workload, sample_population, timed
from benchmarks.shapes import build_model, shape_config
from evolm import dist
from evolm.engine.base import Row, group_rows
from evolm.engine.local import LocalEngine
from evolm.es import ES
from evolm.lora import LoraLayout, LoraPopulation, LoraSpec
from evolm.sampling import Sampling

log = logging.getLogger("benchmarks.distributed")

KS = (1, 2, 4, 8)


def generate_rows(
    engine: LocalEngine, ids: torch.Tensor, pop: LoraPopulation, rows: Sequence[Row], new: int
) -> int:
    """The rows' completions as :meth:`Engine.generate_rows` makes them (one call per set of
    members answering the same prompts), from token ids, exactly ``new`` tokens each; returns
    the number of generated tokens."""
    groups = group_rows(rows)
    tokens, sampling = 0, Sampling(max_new_tokens=new)
    for chosen, members in groups.items():
        part = ids[list(chosen)].repeat(len(members), 1)
        out = generate_ids(
            engine, part, torch.ones_like(part), pop.subset(members), sampling, eos_ids=[]
        )
        tokens += out.numel()
    return tokens


def median_time(device: torch.device, fn: Callable[[], Any], reps: int) -> float:
    fn()  # warm-up: graphs, buffers, allocator
    return statistics.median(timed(device, fn)[0] for _ in range(reps))


def measure(work: Workload, reps: int, comm: dist.Comm) -> dict[str, Any]:
    """This rank's timings (see the module docstring)."""
    device = comm.device
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(work.shape, device, dtype)
    layout = LoraLayout.from_hf_config(shape_config(work.shape), LoraSpec(rank=work.rank))
    engine = from_model(model, layout)
    pop, book = sample_population(work, engine)
    vocab = shape_config(work.shape).vocab_size
    gen = torch.Generator().manual_seed(work.seed)
    ids = torch.randint(0, vocab, (work.prompts, work.prompt_len), generator=gen).to(device)
    rows = [(m, p) for m in range(work.members) for p in range(work.prompts)]

    def run(share: Sequence[Row]) -> Callable[[], int]:
        return lambda: generate_rows(engine, ids, pop, share, work.new_tokens)

    out: dict[str, Any] = {"rank": comm.rank, "device": str(device), **book}
    out["alone_s"] = median_time(device, run(rows), reps)
    out["shard_s"] = {str(k): median_time(device, run(rows[0::k]), reps) for k in KS[1:]}
    out["shard_s"]["1"] = out["alone_s"]

    es = ES(population_size=work.members, sigma=work.sigma)
    state = es.init([torch.zeros(s, device=device) for s in layout.shapes()], seed=0)
    mine = comm.shard(rows)
    scores = {"reward": [float(i) for i in range(len(mine))]}

    def gather() -> None:
        comm.barrier()
        comm.gather(scores)

    def check() -> None:
        comm.barrier()
        comm.check_same(state.mean, "the mean")

    def generation() -> None:
        comm.barrier()
        generate_rows(engine, ids, pop, mine, work.new_tokens)
        parts = comm.gather(scores)
        members = sum(len(p["reward"]) for p in parts) // work.prompts
        fitness = torch.randn(members, generator=torch.Generator().manual_seed(1))
        new, _ = es.tell(state, es.ask(state), fitness)
        comm.check_same(new.mean, "the mean")

    # barriers cost a round trip: time them alone and take them off
    barrier_s = median_time(device, comm.barrier, reps)
    out["gather_s"] = max(0.0, median_time(device, gather, reps) - barrier_s)
    out["check_s"] = max(0.0, median_time(device, check, reps) - barrier_s)
    out["generation_s"] = median_time(device, generation, reps)
    out["payload_floats"] = len(rows)
    return out


def project(ranks: list[dict[str, Any]], world: int) -> dict[str, Any]:
    """Measured W-rank speedup and the projection for K in 2, 4, 8 (from rank 0's device)."""
    r0 = ranks[0]
    alone = r0["alone_s"]
    generation = max(r["generation_s"] for r in ranks)
    gather = max(r["gather_s"] for r in ranks)
    per_peer = gather / (world - 1) if world > 1 else 0.0
    fixed = r0["tell_s"] + max(r["check_s"] for r in ranks)
    projected = {}
    for k in KS[1:]:
        total = r0["shard_s"][str(k)] + per_peer * (k - 1) + fixed
        projected[str(k)] = {
            "seconds": total,
            "speedup": alone / total,
            "comm_fraction": (per_peer * (k - 1) + r0["check_s"]) / total,
        }
    return {
        "world_size": world,
        "alone_s": alone,
        "generation_s": generation,
        "measured_speedup": alone / generation if world > 1 else 1.0,
        "gather_s": gather,
        "comm_fraction": (gather + max(r["check_s"] for r in ranks)) / generation,
        "projected": projected,
    }


def markdown(result: dict[str, Any]) -> str:
    s, w = result["summary"], result["workload"]
    lines = [
        f"Distributed ES generation: {w['shape']}, {w['members']} members x {w['prompts']} "
        f"prompts, {w['prompt_len']} + {w['new_tokens']} tokens; {s['world_size']} rank(s) on "
        f"{result['machine']}",
        "",
        f"- one device, whole population: {s['alone_s']:.3f} s",
        f"- {s['world_size']} ranks, one generation: {s['generation_s']:.3f} s "
        f"(speedup {s['measured_speedup']:.2f}x; all-gather {1e3 * s['gather_s']:.2f} ms, "
        f"communication {100 * s['comm_fraction']:.2f}% of the generation)",
        "",
        "| GPUs | per-rank rows time (s) | projected generation (s) | speedup | comm % |",
        "|---|---|---|---|---|",
    ]
    shard = result["ranks"][0]["shard_s"]
    for k, p in s["projected"].items():
        lines.append(
            f"| {k} | {shard[k]:.3f} | {p['seconds']:.3f} | {p['speedup']:.2f}x | "
            f"{100 * p['comm_fraction']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def machine(device: str) -> str:
    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(torch.device(device))} ({platform.node()})"
    return f"CPU {platform.processor() or platform.machine()} ({platform.node()})"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.distributed", description=__doc__)
    p.add_argument("--shape", default=None, help="model shape (GPU: qwen2.5-1.5b, CPU: tiny)")
    p.add_argument("--members", type=int, default=None, help="GPU 30, CPU 8")
    p.add_argument("--prompts", type=int, default=None, help="GPU 32, CPU 8")
    p.add_argument("--prompt-len", type=int, default=None, help="GPU 64, CPU 16")
    p.add_argument("--new-tokens", type=int, default=None, help="GPU 256, CPU 16")
    p.add_argument("--rank", type=int, default=4, help="LoRA rank")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", type=Path, help="write the result here (rank 0)")
    p.add_argument("--markdown", type=Path, help="write the table here (rank 0)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    comm = dist.setup()
    gpu = torch.cuda.is_available()
    defaults = (
        dict(shape="qwen2.5-1.5b", members=30, prompts=32, prompt_len=64, new_tokens=256)
        if gpu
        else dict(shape="tiny", members=8, prompts=8, prompt_len=16, new_tokens=16)
    )
    chosen = {k: getattr(args, k) or v for k, v in defaults.items()}
    work = Workload(**chosen, rank=args.rank)
    try:
        mine = measure(work, args.reps, comm)
        ranks = comm.gather(mine)
        if comm.is_main:
            result = {
                "machine": machine(mine["device"]),
                "torch": torch.__version__,
                "workload": chosen,
                "ranks": ranks,
                "summary": project(ranks, comm.world_size),
            }
            table = markdown(result)
            log.info("%s", table)
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(result, indent=2) + "\n")
            if args.markdown:
                args.markdown.parent.mkdir(parents=True, exist_ok=True)
                args.markdown.write_text(table)
    finally:
        dist.teardown()


if __name__ == "__main__":
    main()
