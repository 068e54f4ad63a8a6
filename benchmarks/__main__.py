"""``python -m benchmarks``: time one population evaluation per model shape, several ways.

    python -m benchmarks                                   # tiny on CPU; 0.5B and 7B on a GPU
    python -m benchmarks --shape qwen2.5-7b --json out.json --markdown out.md
    python -m benchmarks --shape qwen2.5-0.5b --sglang-url http://127.0.0.1:30000 \\
        --sglang-model-path /tmp/m-0.5b                     # + evolm with server=sglang
    python -m benchmarks --shape qwen2.5-0.5b --save-model /tmp/m-0.5b   # a dir to serve
    python -m benchmarks --real --shape qwen2.5-1.5b --sglang-python /tmp/sgpy  # W-real
    python -m benchmarks --real --regimes variable --methods continuous --ranks 2 \
        --shard interleaved,balanced                        # W-real's 2 shards, each way

Imports neither Hydra nor evolm's config: it runs where only torch and transformers are.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import torch

from benchmarks.methods import Workload
from benchmarks.report import markdown
from benchmarks.shapes import SHAPES, build_model, save_model
from benchmarks.suite import DEFAULT_METHODS, METHODS, run_workload
from evolm.engine.options import DTYPES, LocalOptions, Tuning

log = logging.getLogger("benchmarks")
REAL = "continuous,continuous_fp8,sglang,evolm_sglang"
REAL_OPT_IN = "continuous_w8,continuous_w8_fp8,continuous_spec,continuous_spec_r540"  # named

GPU_DEFAULTS = {"members": 30, "prompts": 32, "prompt_len": 64, "new_tokens": 128}
CPU_DEFAULTS = {"members": 4, "prompts": 4, "prompt_len": 16, "new_tokens": 8}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    p.add_argument("--shape", action="append", choices=sorted(SHAPES), help="repeatable")
    p.add_argument("--members", type=int, help="N (GPU default 30, CPU 4)")
    p.add_argument("--prompts", type=int, help="P (GPU default 32, CPU 4)")
    p.add_argument("--prompt-len", type=int, help="tokens per prompt (GPU 64, CPU 16)")
    p.add_argument("--new-tokens", type=int, help="forced new tokens (GPU 128, CPU 8)")
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--dtype", choices=sorted(DTYPES), help="default bfloat16 (GPU), float32 (CPU)")
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--methods", help=f"subset of {','.join(METHODS)} (--real: of {REAL},{REAL_OPT_IN})"
    )
    p.add_argument("--real", action="store_true", help="W-real: 30 x 200 rows, up to 1,024 new")
    p.add_argument("--regimes", default="variable,fixed", help="--real: fixed and/or variable")
    p.add_argument("--sglang-python", help="--real: python that runs sglang.launch_server")
    p.add_argument(
        "--ranks", type=int, default=1, help="--real: also time each of K shards (K GPUs' rows)"
    )
    p.add_argument(
        "--shard",
        default="interleaved",
        help="--real --ranks K: interleaved (rows r, r+K, ...), balanced (by "
        "row budget, LPT) or interleaved,balanced",
    )
    p.add_argument(
        "--wave-rows", type=int, default=2000, help="--real: ignored (the waves path was removed)"
    )
    p.add_argument("--reps", type=int, default=3, help="timed runs of (a), (b), (e)")
    p.add_argument("--baseline-members", type=int, default=3, help="members timed for (c), (d)")
    p.add_argument("--sglang-url", help="(e): an SGLang server serving --sglang-model-path")
    p.add_argument("--sglang-model-path", help="the model directory the server serves")
    p.add_argument("--save-model", help="write the (first) shape's random model here and exit")
    p.add_argument("--profile", action="store_true", help="top GPU kernels of one evolm run")
    p.add_argument("--bucket", type=int, help="removed with the waves path (refused)")
    p.add_argument("--prefill-tokens", type=int, help="fast path: tokens per prefill chunk")
    p.add_argument("--no-graphs", action="store_true", help="fast path: no CUDA graphs")
    p.add_argument("--batching", default="continuous", help="continuous (waves: removed, refused)")
    p.add_argument("--json", help="write the records here")
    p.add_argument("--markdown", help="write the tables here")
    return p.parse_args(argv)


def workloads(args: argparse.Namespace, device: torch.device) -> list[Workload]:
    defaults = GPU_DEFAULTS if device.type == "cuda" else CPU_DEFAULTS
    sizes = {k: getattr(args, k) or v for k, v in defaults.items()}
    dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    shapes = args.shape or (["qwen2.5-0.5b", "qwen2.5-7b"] if device.type == "cuda" else ["tiny"])
    return [Workload(shape=s, rank=args.rank, dtype=dtype, **sizes) for s in shapes]


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse(argv)
    if args.bucket is not None or args.batching != "continuous":
        raise SystemExit(
            "--bucket / --batching: the lock-step waves path was removed (continuous batching "
            "replaced it); to time it, run the older tree's python -m evolm.bench"
        )
    device = LocalOptions(device=args.device).resolve_device()
    if args.real:
        from benchmarks import real

        args.methods = args.methods or REAL
        return real.main(args, device)
    args.methods = args.methods or ",".join(DEFAULT_METHODS)
    works = workloads(args, device)
    if args.save_model:
        model = build_model(works[0].shape, device, DTYPES[works[0].dtype])
        log.info("saved %s to %s", works[0].shape, save_model(model, args.save_model))
        return 0
    runner = None
    if args.sglang_url:
        from benchmarks.external import sglang_runner

        runner = sglang_runner(args.sglang_url, args.sglang_model_path or "")
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; choose from {','.join(METHODS)}")
    records = []
    for work in works:
        tuning = Tuning(
            cuda_graphs=False if args.no_graphs else None, prefill_tokens=args.prefill_tokens
        )
        records.append(
            run_workload(
                work,
                device,
                methods,
                args.reps,
                args.baseline_members,
                runner,
                args.profile,
                tuning,
            )
        )
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if args.json:  # after every workload: a later one may run out of time
            Path(args.json).write_text(json.dumps(records, indent=2))
    table = markdown(records)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
