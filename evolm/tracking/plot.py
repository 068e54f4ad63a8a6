"""figures/evolution.png: fitness mean with its 20th-80th percentile band, and eval reward."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from evolm import metrics as M


def plot_evolution(records: Sequence[dict[str, Any]], path: Path) -> None:
    """Draw the records' curves and replace ``path`` atomically."""
    train = [r for r in records if M.FITNESS_MEAN in r]
    evals = [r for r in records if M.EVAL_REWARD in r]
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    if train:
        g = [r[M.GENERATION] for r in train]
        ax.fill_between(
            g,
            [r[M.FITNESS_P20] for r in train],
            [r[M.FITNESS_P80] for r in train],
            alpha=0.3,
            label="population p20-p80",
        )
        ax.plot(g, [r[M.FITNESS_MEAN] for r in train], label="population mean")
    if evals:
        ax.plot(
            [r[M.GENERATION] for r in evals],
            [r[M.EVAL_REWARD] for r in evals],
            "o--",
            label="mean adapter, eval",
        )
    ax.set_xlabel("generation")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, dpi=100, format="png")
    os.replace(tmp, path)
