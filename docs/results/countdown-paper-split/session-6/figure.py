"""Session 6's figure: accuracy of the mean on the paper's 2,000 test puzzles against training
time (solid), its answer forms written without reading the target (dashed,
``eval/blind_accuracy``), for p0 (seed 0, sessions 5 + 6), p1 (seed 1) and the 0.5B in the same
setting (q0, q1), beside what trivial answers score on the same puzzles.

    cd docs/results/countdown-paper-split && python session-6/figure.py  # session-6/accuracy.png
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).resolve().parent
BLIND = "eval/blind_accuracy"
BEST_RULE, SUM = 17.5, 2.3  # python -m evolm.task.countdown.stats on the 2,000 test puzzles
RUNS = {  # label: (records, earlier records of the same run: a resumed run's evals before it)
    "1.5B p0, seed 0": (HERE / "p0.jsonl", HERE.parent / "session-5" / "p0.jsonl"),
    "1.5B p1, seed 1": (HERE / "p1.jsonl", None),
    "0.5B q0, seed 0": (HERE / "q0.jsonl", None),
    "0.5B q1, seed 1": (HERE / "q1.jsonl", None),
}
BASE = {"1.5B": HERE.parent / "session-5" / "p0.jsonl", "0.5B": HERE / "q0.jsonl"}


def evals(*paths: Path | None, last: int | None = None) -> dict[float, tuple[float, float]]:
    """{training minutes: (accuracy %, blind %)} over the evals in ``paths`` (up to generation
    ``last``)."""
    out = {}
    for path in paths:
        for line in path.open() if path else ():
            r = json.loads(line)
            if "eval/accuracy_mean" in r and (last is None or r["generation"] <= last):
                at = r.get("time/train_s", 0.0) / 60
                out[at] = (100 * r["eval/accuracy_mean"], 100 * r.get(BLIND, float("nan")))
    return dict(sorted(out.items()))


def main() -> None:
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = ("C3", "C1", "C0", "C9")
    for (name, (path, before)), color in zip(RUNS.items(), colors, strict=True):
        base = evals(BASE[name.split()[0]], last=0)  # a seed-1 run (eval_start=false): seed 0's
        points = base | evals(before, path)
        minutes = list(points)
        ax.plot(minutes, [a for a, _ in points.values()], "-o", color=color, label=name)
        ax.plot(minutes, [b for _, b in points.values()], "--", color=color, alpha=0.6)
    for level, text in ((BEST_RULE, "best fixed rule"), (SUM, "adding all the numbers")):
        ax.axhline(level, color="k", lw=0.8, ls=":")
        ax.text(0.5, level + 0.4, f"{text}, never reading the target: {level}%", fontsize=8)
    ax.set_xlabel("training minutes on one H200 (generate + score + update; evals excluded)")
    ax.set_ylabel("% of the paper's 2,000 test puzzles")
    title = "Qwen2.5-Coder Instruct, chat prompt, LoRA rank 4, population 30, answer-only reward"
    ax.set_title(f"{title}\nsolid: accuracy; dashed: its answer forms written blindly", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(HERE / "accuracy.png", dpi=120)


if __name__ == "__main__":
    main()
