"""The evolution figure (``figures/evolution.png``), redrawn as the run goes."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from evolm.callbacks.base import Callback, RunContext
from evolm.callbacks.record import GenerationRecord, Record
from evolm.es import ESState
from evolm.tracking.plot import plot_evolution


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

    def on_generation_end(self, ctx: RunContext, record: GenerationRecord, state: ESState) -> None:
        self.records.append(record.as_record())
        if time.monotonic() - self.last_draw >= self.min_interval_s:
            self.draw(ctx)

    def on_run_end(self, ctx: RunContext, summary: Record, state: ESState) -> None:
        self.draw(ctx)

    def draw(self, ctx: RunContext) -> None:
        plot_evolution(self.records, Path(ctx.output_dir) / "figures" / "evolution.png")
        self.last_draw = time.monotonic()
