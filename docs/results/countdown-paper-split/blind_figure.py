"""Session 3's figure and table: each saved eval's accuracy beside what its answer forms score
written without reading the target (:mod:`evolm.task.countdown.blind`).

    cd docs/results/countdown-paper-split && python blind_figure.py   # -> session-3/blind.png
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from sign_choice import read

from evolm.task.countdown.blind import BlindRates
from evolm.task.countdown.reward import extract_answer, parse_answer

RUNS = {
    "cd0 (LoRA)": [
        (0, "session-2/cd0-gen000-answers.jsonl.xz"),
        (40, "session-2/cd0-gen040-answers.jsonl.xz"),
        *[(g, f"session-3/cd0-gen{g:03d}-answers.jsonl.xz") for g in range(60, 161, 20)],
    ],
    "fd0 (full)": [(g, f"session-3/fd0-gen{g:03d}-answers.jsonl.xz") for g in range(0, 61, 20)],
}


def accuracy_and_blind(path: str) -> tuple[float, float]:
    answers = read(Path(path))
    blind = BlindRates([(numbers, target) for numbers, target, _ in answers])
    rates = []
    for numbers, _, row in answers:
        answer = extract_answer(row["completion"])
        parsed = None if answer is None else parse_answer(answer)
        rates.append(blind.of_answer(None if parsed is None else parsed[0], numbers))
    accuracy = sum(row["scores"]["accuracy"] > 0 for _, _, row in answers) / len(answers)
    return accuracy, sum(rates) / len(rates)


def main() -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for (name, points), color in zip(RUNS.items(), ("C0", "C1"), strict=True):
        values = [(g, *accuracy_and_blind(path)) for g, path in points]
        gens = [g for g, _, _ in values]
        ax.plot(gens, [a * 100 for _, a, _ in values], "-o", color=color, label=f"{name}: accuracy")
        ax.plot(gens, [b * 100 for _, _, b in values], "--", color=color,
                label=f"{name}: its answer forms, blind")  # fmt: skip
        for g, a, b in values:
            print(f"| {name} | {g} | {a:.1%} | {b:.1%} | {a - b:+.1%} |")
    ax.axhline(17.5, color="gray", ls=":", label="best fixed rule (17.5%)")
    ax.set_xlabel("generation")
    ax.set_ylabel("% of the paper's 2,000 test puzzles")
    ax.set_title("Qwen2.5-Coder-1.5B, chat prompt: accuracy = what its forms score blindly")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig("session-3/blind.png", dpi=110)


if __name__ == "__main__":
    main()
