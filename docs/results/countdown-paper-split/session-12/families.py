"""Accuracy of an evolm samples file (``samples/gen-NNN.jsonl``, countdown, chat prompt) by
number count and by the fixed rules that solve the puzzle (evolm's ``classify``): ``order``, a
fixed operator pattern in the puzzle's order (a template); ``size``, only a size-order rule
(the same patterns over the numbers sorted largest first); ``none``, no fixed rule. The eval's
own metrics do not cross these with the number count.

    python families.py samples/gen-000.jsonl   # or a committed answers file (.xz)
"""

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from puzzles import rows  # committed answers name the paper's puzzles by id

from evolm.task.countdown.shortcuts import classify


def main() -> None:
    acc: dict[tuple[int, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for numbers, target, row in rows(Path(sys.argv[1])):  # the puzzle's turn, not a shot's
        info = classify(numbers, target)
        kind = "order" if info.patterns else "size" if info.ranked else "none"
        acc[len(numbers), kind][0] += row["scores"]["accuracy"]
        acc[len(numbers), kind][1] += 1
    for (n, kind), (right, count) in sorted(acc.items()):
        print(f"{n} numbers, {kind}: {count} puzzles, accuracy {right / count:.4f}")


if __name__ == "__main__":
    main()
