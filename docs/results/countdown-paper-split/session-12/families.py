"""Accuracy of an evolm samples file (``samples/gen-NNN.jsonl``, countdown, chat prompt) by
number count and by the fixed rules that solve the puzzle (evolm's ``classify``): ``order``, a
fixed operator pattern in the puzzle's order (a template); ``size``, only a size-order rule
(the same patterns over the numbers sorted largest first); ``none``, no fixed rule. The eval's
own metrics do not cross these with the number count.

    python families.py samples/gen-000.jsonl
"""

import json
import re
import sys
from collections import defaultdict

from evolm.task.countdown.shortcuts import classify


def main() -> None:
    acc: dict[tuple[int, str], list[float]] = defaultdict(lambda: [0.0, 0])
    with open(sys.argv[1]) as f:
        for line in f:
            row = json.loads(line)
            user = row["prompt"].split("<|im_start|>user\n")[-1]  # the puzzle's turn, not a shot's
            numbers = [int(x) for x in re.search(r"numbers \[([^\]]*)\]", user).group(1).split()]
            target = re.search(r"equals (-?\d+(?:\.\d+)?)\. ", user).group(1)
            info = classify(numbers, target)
            kind = "order" if info.patterns else "size" if info.ranked else "none"
            acc[len(numbers), kind][0] += row["scores"]["accuracy"]
            acc[len(numbers), kind][1] += 1
    for (n, kind), (right, rows) in sorted(acc.items()):
        print(f"{n} numbers, {kind}: {rows} puzzles, accuracy {right / rows:.4f}")


if __name__ == "__main__":
    main()
