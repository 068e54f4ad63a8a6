"""The comparison's outputs from two (or more) run directories: one figure, one table.

A run directory holds ``results.jsonl`` (evolm's keys), ``config.yaml`` and
``peak_memory.json`` (:mod:`baselines.memory`). The x axis is GPU-seconds of training:
``time/train_s`` (evaluations and start-up excluded, for both methods) times the GPUs used.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import yaml

from baselines.grpo_data import TOKENS
from baselines.memory import read_peak
from evolm import metrics as M
from evolm.callbacks.health import learned_a_shortcut

ACCURACY = M.eval_score(M.CORRECT_SCORE)
BEYOND = M.eval_diagnostic(M.ACCURACY_BEYOND_SHORTCUTS)
SHORTCUT = M.eval_diagnostic(M.SHORTCUT_ACCURACY)
PANELS = {ACCURACY: "held-out accuracy", BEYOND: "accuracy beyond shortcuts"}
COLORS = {"es": "tab:blue", "grpo": "tab:orange"}


@dataclass
class Point:
    """One evaluation: the training spent before it and what it measured."""

    generation: int
    gpu_s: float
    tokens: float
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Run:
    name: str
    run_dir: Path
    records: list[dict[str, Any]]
    config: dict[str, Any]
    peak: dict[str, Any] | None
    gpus: int = 1

    @classmethod
    def load(cls, name: str, run_dir: Path, gpus: int = 1) -> Run:
        lines = (run_dir / "results.jsonl").read_text().splitlines()
        config_file = run_dir / "config.yaml"
        config = yaml.safe_load(config_file.read_text()) if config_file.is_file() else {}
        return cls(
            name, run_dir, [json.loads(x) for x in lines if x], config, read_peak(run_dir), gpus
        )

    def tokens(self, record: dict[str, Any]) -> float:
        """Tokens generated for this record's update: GRPO writes them; for ES, every member's
        completion of every training prompt of the generation (``train/completion_tokens`` is
        their mean, ``train/prompts`` their number; a record without it: the config's
        ``task.samples_per_generation``, or with ``null`` every training puzzle)."""
        if TOKENS in record:
            return float(record[TOKENS])
        mean = record.get(M.train_diagnostic(M.COMPLETION_TOKENS))
        es, task = self.config.get("es", {}), self.config.get("task", {})
        prompts = record.get(M.train_diagnostic(M.PROMPTS)) or (
            task.get("samples_per_generation") or task.get("train_size") or 0
        )
        rows = es.get("population_size", 0) * prompts
        return float(mean) * rows if mean is not None else math.nan

    def points(self) -> list[Point]:
        out, tokens = [], 0.0
        for r in self.records:
            if r.get(M.GENERATION, 0) > 0:
                tokens += self.tokens(r)
            if M.EVAL_REWARD in r:
                train_s = r.get(M.TRAIN_S, 0.0)
                values = {k: v for k, v in r.items() if k.startswith("eval/") and v is not None}
                out.append(Point(r[M.GENERATION], train_s * self.gpus, tokens, values))
        return out

    def summary(self) -> dict[str, Any]:
        points = self.points()
        first, last = points[0], points[-1]
        updates = [r for r in self.records if r.get(M.GENERATION, 0) > 0]
        out: dict[str, Any] = {
            "method": self.name,
            "updates": len(updates),
            "train_s": updates[-1].get(M.TRAIN_S, 0.0) if updates else 0.0,
            "gpus": self.gpus,
            "gpu_s": last.gpu_s,
            "tokens": last.tokens,
            "peak_gb": None if self.peak is None else self.peak["peak_gb"],
            "peak_device": None if self.peak is None else self.peak["device"],
            "device_name": None if self.peak is None else self.peak.get("name"),
            "eval_s": sum(r.get(M.EVAL_S, 0.0) for r in self.records),
        }
        for key in (ACCURACY, BEYOND, M.EVAL_REWARD, M.EVAL_KL_MEAN):
            if key in last.metrics:
                out[f"start {key}"] = first.metrics.get(key)
                out[f"final {key}"] = last.metrics[key]
                out[f"best {key}"] = max(p.metrics.get(key, -math.inf) for p in points)
        if ACCURACY in first.metrics and ACCURACY in last.metrics:
            # the health monitor's test, start to end: a rise the answers' skill did not make
            out["shortcut"] = learned_a_shortcut(first.metrics, last.metrics)
        return out


def device_unit(runs: list[Run]) -> str:
    """``GPU`` where every run trained on one (its peak memory says so), else ``CPU``."""
    cuda = all(r.peak is not None and r.peak.get("device") == "cuda" for r in runs)
    return "GPU" if cuda else "CPU"


def figure(runs: list[Run], path: Path, title: str) -> Path:
    """Accuracy and accuracy beyond shortcuts (or the reward, for a task without them) against
    GPU-seconds of training, one line per method."""
    unit = device_unit(runs)
    if unit == "CPU":
        title += " (CPU smoke run, no GPU)"
    keys = [k for k in PANELS if any(k in p.metrics for r in runs for p in r.points())]
    keys = keys or [M.EVAL_REWARD]
    fig, axes = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 4), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        for run in runs:
            pts = [p for p in run.points() if key in p.metrics]
            ax.plot(
                [p.gpu_s for p in pts],
                [p.metrics[key] for p in pts],
                marker="o",
                label=run.name.upper(),
                color=COLORS.get(run.name),
            )
        shortcut = next(
            (p.metrics[SHORTCUT] for r in runs for p in r.points() if SHORTCUT in p.metrics), None
        )
        if key == ACCURACY and shortcut is not None:
            ax.axhline(shortcut, color="gray", linestyle=":", label="best answer template")
        ax.set_xlabel(f"{unit}-seconds of training (evals excluded)")
        ax.set_ylabel(PANELS.get(key, key))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def markdown(runs: list[Run]) -> str:
    """The table: what each method spent and reached; then every evaluation."""
    summaries = [r.summary() for r in runs]
    rows = [
        ("device", "device_name", "{}"),
        ("updates (ES generations / GRPO steps)", "updates", "{:d}"),
        (f"{device_unit(runs)}-seconds of training", "gpu_s", "{:.0f}"),
        ("tokens generated in training", "tokens", "{:,.0f}"),
        ("peak memory (GiB)", "peak_gb", "{:.2f}"),
        ("evaluation seconds (not counted)", "eval_s", "{:.0f}"),
        ("its gain a shortcut? (evolm's health test, start to end)", "shortcut", "{}"),
    ]
    for key in (ACCURACY, BEYOND, M.EVAL_REWARD, M.EVAL_KL_MEAN):
        rows += [
            (f"{which} `{key}`", f"{which} {key}", "{:.4f}") for which in ("start", "final", "best")
        ]
    head = "| | " + " | ".join(s["method"].upper() for s in summaries) + " |"
    lines = [head, "|---|" + "---:|" * len(summaries)]
    for label, key, fmt in rows:
        if all(s.get(key) is None for s in summaries):
            continue
        cells = [_cell(s.get(key), fmt) for s in summaries]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    unit = device_unit(runs)
    lines += [
        "",
        f"| method | generation | {unit}-s | tokens | accuracy | beyond shortcuts | reward |",
    ]
    lines.append("|---|---:|---:|---:|---:|---:|---:|")
    for run in runs:
        for p in run.points():
            acc, beyond = p.metrics.get(ACCURACY), p.metrics.get(BEYOND)
            lines.append(
                f"| {run.name.upper()} | {p.generation} | {p.gpu_s:.0f} | {p.tokens:,.0f} | "
                f"{_num(acc)} | {_num(beyond)} | {p.metrics[M.EVAL_REWARD]:.4f} |"
            )
    return "\n".join(lines) + "\n"


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "**yes**" if value else "no"
    return fmt.format(value)


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def write_report(runs: list[Run], out: Path, title: str) -> dict[str, Path]:
    """``comparison.png``, ``comparison.md`` and ``comparison.json`` in ``out``."""
    paths = {
        "figure": out / "comparison.png",
        "table": out / "comparison.md",
        "json": out / "comparison.json",
    }
    figure(runs, paths["figure"], title)
    smoke = " (CPU smoke run, no GPU)" if device_unit(runs) == "CPU" else ""
    paths["table"].write_text(f"# {title}{smoke}\n\n" + markdown(runs))
    paths["json"].write_text(json.dumps([r.summary() for r in runs], indent=2) + "\n")
    return paths
