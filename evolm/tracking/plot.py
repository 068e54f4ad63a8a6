"""figures/evolution.png. Top: fitness mean with its 20th-80th percentile band, eval reward,
and the mean's KL to the base model on its own axis. Below: the completions' diagnostics
(:mod:`evolm.diagnostics`): empty and truncated shares, antithetic pair agreement, and the mean
completion length on its own axis."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from evolm import metrics as M

SHARES = {  # metric -> (label, line style and colour)
    M.train_diagnostic(M.EMPTY_SHARE): ("empty (population)", "C0-"),
    M.eval_diagnostic(M.EMPTY_SHARE): ("empty (mean, eval)", "C0o--"),
    M.train_diagnostic(M.TRUNCATED_SHARE): ("truncated (population)", "C3-"),
    M.eval_diagnostic(M.TRUNCATED_SHARE): ("truncated (mean, eval)", "C3o--"),
    M.train_diagnostic(M.PAIR_AGREEMENT): ("antithetic pairs tied", "C2:"),
}


def plot_evolution(records: Sequence[dict[str, Any]], path: Path) -> None:
    """Draw the records' curves and replace ``path`` atomically."""
    fig = Figure(figsize=(7, 6.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    plot_reward(top, records)
    plot_completions(bottom, records)
    bottom.set_xlabel("generation")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, dpi=100, format="png")
    os.replace(tmp, path)


def plot_reward(ax: Axes, records: Sequence[dict[str, Any]]) -> None:
    train = [r for r in records if M.FITNESS_MEAN in r]
    evals = [r for r in records if M.EVAL_REWARD in r]
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
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    kl = [
        (r[M.GENERATION], r[M.EVAL_KL_MEAN]) for r in records if r.get(M.EVAL_KL_MEAN) is not None
    ]
    if kl:  # how far the mean is from the base model, next to what it gained
        right = ax.twinx()
        line = right.plot(*zip(*kl, strict=True), "s:", color="C5", label="KL to base, eval")
        right.set_ylabel("KL(mean || base) per token", color="C5")
        right.set_ylim(bottom=0)
        handles, labels = handles + line, [*labels, "KL to base, eval"]
    if handles:
        ax.legend(handles, labels, loc="lower right")


def plot_completions(ax: Axes, records: Sequence[dict[str, Any]]) -> None:
    """The shares on [0, 1] and the mean length in tokens (right axis), where recorded."""
    for key, (label, style) in SHARES.items():
        points = [(r[M.GENERATION], r[key]) for r in records if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points, strict=True), style, label=label, markersize=3)
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel("share of completions")
    ax.grid(alpha=0.3)
    length = M.train_diagnostic(M.COMPLETION_TOKENS)
    points = [(r[M.GENERATION], r[length]) for r in records if r.get(length) is not None]
    if points:
        right = ax.twinx()
        right.plot(*zip(*points, strict=True), color="grey", alpha=0.6, label="tokens (population)")
        right.set_ylabel("mean tokens", color="grey")
        right.set_ylim(bottom=0)
    if ax.lines:
        ax.legend(loc="upper left", fontsize="small")
