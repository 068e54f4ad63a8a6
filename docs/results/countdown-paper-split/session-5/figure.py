"""Session 5's figure: the mean's accuracy on the paper's 2,000 test puzzles (solid) beside what
its own answer forms score written without reading the target (dashed, ``eval/blind_accuracy``),
per run, against cd0 (session 2-3: the paper's stated reward, format term 0.1) and what trivial
answers score on the same puzzles.

    cd docs/results/countdown-paper-split && python session-5/figure.py  # session-5/accuracy.png
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).resolve().parent
RUNS = {
    "p0: the paper's effective reward (format 0), 200 puzzles": HERE / "p0.jsonl",
    "s200: blind baseline + closeness, format 0.02, 200 puzzles": HERE / "s200.jsonl",
    "s0: the same, 116 template-free puzzles": HERE / "s0.jsonl",
    "s1: s0 with seed 1": HERE / "s1.jsonl",
    "cd0 (sessions 2-3): format 0.1, 116 puzzles": HERE.parent / "session-3" / "cd0.jsonl",
}
BLIND = "eval/blind_accuracy"
BEST_RULE, SUM = 17.5, 2.3  # python -m evolm.task.countdown.stats on the 2,000 test puzzles


def evals(path: Path, last: int = 70) -> list[tuple[int, float, float]]:
    rows = (json.loads(line) for line in path.open())
    return [
        (r["generation"], 100 * r["eval/accuracy_mean"], 100 * r.get(BLIND, float("nan")))
        for r in rows
        if "eval/accuracy_mean" in r and r["generation"] <= last
    ]


def main() -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (name, path), color in zip(RUNS.items(), ("C3", "C1", "C0", "C9", "C7"), strict=True):
        points = evals(path)
        gens = [g for g, _, _ in points]
        ax.plot(gens, [a for _, a, _ in points], "-o", color=color, label=name)
        ax.plot(gens, [b for _, _, b in points], "--", color=color, alpha=0.6)
    ax.axhline(BEST_RULE, color="k", lw=0.8, ls=":")
    rule = f"best fixed rule, never reading the target: {BEST_RULE}%"
    ax.text(30, BEST_RULE + 0.4, rule, fontsize=8)
    ax.axhline(SUM, color="k", lw=0.8, ls=":")
    ax.text(30, SUM + 0.4, f"adding all the numbers: {SUM}%", fontsize=8)
    ax.set_xlabel("generation")
    ax.set_ylabel("% of the paper's 2,000 test puzzles")
    title = "Qwen2.5-Coder-1.5B-Instruct, chat prompt, LoRA rank 4, population 30"
    ax.set_title(f"{title}\nsolid: accuracy; dashed: its answer forms written blindly", fontsize=10)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(HERE / "accuracy.png", dpi=120)


if __name__ == "__main__":
    main()
