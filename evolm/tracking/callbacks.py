"""Built-in callbacks: results as JSON lines, the evolution figure, a progress bar, and the
final adapter (always added by the composition root)."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from evolm import metrics as M
from evolm.es import ESState
from evolm.loop import Callback, Record, RunContext
from evolm.lora import save_adapter
from evolm.tracking.plot import plot_evolution

log = logging.getLogger(__name__)


def json_line(record: Record) -> str:
    """One JSON line; non-finite floats become null."""
    clean = {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()
    }
    return json.dumps(clean) + "\n"


class ResultsWriter(Callback):
    """Appends every record to ``<run dir>/<filename>`` as one JSON line, flushed at once.

    At the start the file is rewritten with ``ctx.history``: empty for a fresh run, and for a
    resumed run the checkpoint's records, which truncates whatever the interrupted run wrote
    after its checkpoint (no duplicate generations).
    """

    def __init__(self, filename: str = "results.jsonl") -> None:
        self.filename = filename

    def on_run_start(self, ctx: RunContext, state: ESState) -> None:
        path = Path(ctx.output_dir) / self.filename
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(json_line(r) for r in ctx.history), encoding="utf-8")
        os.replace(tmp, path)

    def on_generation_end(self, ctx: RunContext, record: Record, state: ESState) -> None:
        with open(Path(ctx.output_dir) / self.filename, "a", encoding="utf-8") as f:
            f.write(json_line(record))


class EvolutionPlot(Callback):
    """Redraws ``<run dir>/figures/evolution.png`` after a generation and always at the end.

    Drawing costs ~0.1 s, more than a tiny-model generation: it is skipped while the last draw
    is younger than ``min_interval_s`` (0 redraws after every generation).
    """

    def __init__(self, min_interval_s: float = 2.0) -> None:
        self.min_interval_s = min_interval_s
        self.records: list[dict[str, Any]] = []
        self.last_draw = -math.inf

    def on_run_start(self, ctx: RunContext, state: ESState) -> None:
        self.records, self.last_draw = list(ctx.history), -math.inf

    def on_generation_end(self, ctx: RunContext, record: Record, state: ESState) -> None:
        self.records.append(record)
        if time.monotonic() - self.last_draw >= self.min_interval_s:
            self.draw(ctx)

    def on_run_end(self, ctx: RunContext, summary: Record, state: ESState) -> None:
        self.draw(ctx)

    def draw(self, ctx: RunContext) -> None:
        plot_evolution(self.records, Path(ctx.output_dir) / "figures" / "evolution.png")
        self.last_draw = time.monotonic()


class ProgressBar(Callback):
    """A tqdm bar over generations showing fitness and the latest eval reward.

    Where the bar is not drawn (its stream, stderr, is not a terminal: output redirected to a
    file or a pipe, or ``disable``), it logs one concise line every ``log_every`` generations
    instead (and the first and last): generation, fitness mean and std, eval reward, seconds.
    """

    def __init__(self, disable: bool | None = None, log_every: int = 1) -> None:
        self.disable = disable
        self.log_every = max(1, log_every)
        self.bar: tqdm | None = None
        self.postfix: dict[str, str] = {}

    def on_run_start(self, ctx: RunContext, state: ESState) -> None:
        self.bar = tqdm(
            total=ctx.generations,
            initial=state.generation,
            desc="ES",
            unit="gen",
            disable=self.disable,
            dynamic_ncols=True,
        )
        self.postfix = {}
        for record in ctx.history:  # a resumed run shows where it stopped
            self._note(record)
        self.bar.set_postfix(self.postfix)

    def _note(self, record: Record) -> None:
        if M.FITNESS_MEAN in record:
            self.postfix["fitness"] = f"{record[M.FITNESS_MEAN]:.4g}"
            self.postfix["max"] = f"{record[M.FITNESS_MAX]:.4g}"
        if M.EVAL_REWARD in record:
            self.postfix["eval"] = f"{record[M.EVAL_REWARD]:.4g}"

    def on_generation_end(self, ctx: RunContext, record: Record, state: ESState) -> None:
        if self.bar is None:
            return
        self._note(record)
        if M.FITNESS_MEAN in record:
            self.bar.update(1)
        self.bar.set_postfix(self.postfix)
        g = int(record[M.GENERATION])
        if self.bar.disable and (g % self.log_every == 0 or g in (1, ctx.generations)):
            log.info("%s", progress_line(record, ctx.generations))

    def on_run_end(self, ctx: RunContext, summary: Record, state: ESState) -> None:
        if self.bar is not None:
            self.bar.close()

    def on_run_error(self, ctx: RunContext, error: BaseException) -> None:
        if self.bar is not None:
            self.bar.close()


def progress_line(record: Record, generations: int) -> str:
    """``generation 3/40: fitness 0.1234 (std 0.0456), eval reward 0.2100, 1.3 s``."""
    parts = []
    if M.FITNESS_MEAN in record:
        parts.append(f"fitness {record[M.FITNESS_MEAN]:.4g} (std {record[M.FITNESS_STD]:.4g})")
    if M.EVAL_REWARD in record:
        parts.append(f"eval reward {record[M.EVAL_REWARD]:.4g}")
    seconds = record.get(M.GENERATION_S, 0.0) + record.get(M.EVAL_S, 0.0)
    parts.append(f"{seconds:.1f} s")
    return f"generation {record[M.GENERATION]}/{generations}: {', '.join(parts)}"


class ModelWriter(Callback):
    """``es.mean=full``: writes the final mean as a plain transformers model directory
    (config, tokenizer, safetensors; the base's dtype) to ``<run dir>/<dirname>``, atomically,
    at the end of the run: it loads anywhere with no merge step (:mod:`evolm.model.full`)."""

    def __init__(self, base_dir: str, names: Sequence[str], dirname: str = "model") -> None:
        self.base_dir, self.names, self.dirname = base_dir, list(names), dirname

    def on_run_end(self, ctx: RunContext, summary: Record, state: ESState) -> None:
        from evolm.model.full import save_model

        path = Path(ctx.output_dir) / self.dirname
        save_model(path, self.base_dir, dict(zip(self.names, state.mean, strict=True)))
        log.info("final model: %s", path)


class AdapterWriter(Callback):
    """Writes the final mean adapter to ``<run dir>/<dirname>`` in PEFT format (atomically) at
    the end of the run. The composition root adds it before every configured callback, so it is
    written with any ``callbacks``/``logger`` choice and exists when a logger uploads it."""

    def __init__(self, dirname: str = "adapter") -> None:
        self.dirname = dirname

    def on_run_end(self, ctx: RunContext, summary: Record, state: ESState) -> None:
        path = Path(ctx.output_dir) / self.dirname
        save_adapter(path, ctx.layout, state.mean, base_model=ctx.base_model)
        log.info("final adapter: %s", path)
