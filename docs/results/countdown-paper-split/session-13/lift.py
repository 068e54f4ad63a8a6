"""What the blind-baseline reward (``task.blind_baseline=true``) would pay an evolm samples file's
answers (``samples/gen-NNN.jsonl``, countdown, chat prompt) on three sets of 3-number puzzles,
the training sets of the runs b3, o3 and f3 (results page, Next): accuracy, the mean blind
baseline of the answers' forms (their blind rates on that same set, as the reward computes
them on a run's training puzzles) and the difference, the mean reward ES would see.

    tar -xJf ../session-12/s3-answers.tar.xz && python lift.py samples/gen-000.jsonl
"""

import json
import re
import sys

from evolm.task.countdown.blind import BlindRates
from evolm.task.countdown.reward import extract_answer, parse_answer
from evolm.task.countdown.shortcuts import classify


def tokens(completion: str) -> list[str] | None:
    answer = extract_answer(completion)
    parsed = None if answer is None else parse_answer(answer)
    return None if parsed is None else parsed[0]


def main() -> None:
    rows = []
    with open(sys.argv[1]) as f:
        for line in f:
            row = json.loads(line)
            user = row["prompt"].split("<|im_start|>user\n")[-1]  # the puzzle's turn
            numbers = [int(x) for x in re.search(r"numbers \[([^\]]*)\]", user).group(1).split()]
            target = re.search(r"equals (-?\d+(?:\.\d+)?)\. ", user).group(1)
            info = classify(numbers, target)
            kind = "order" if info.patterns else "size" if info.ranked else "none"
            rows.append(
                (numbers, float(target), kind, row["scores"]["accuracy"], row["completion"])
            )
    sets = {
        "b3: all 3-number puzzles": lambda kind: True,
        "o3: no puzzle-order template": lambda kind: kind != "order",
        "f3: no fixed rule": lambda kind: kind == "none",
    }
    for name, keep in sets.items():
        chosen = [r for r in rows if len(r[0]) == 3 and keep(r[2])]
        rates = BlindRates([(numbers, target) for numbers, target, *_ in chosen])
        accuracy = sum(r[3] for r in chosen) / len(chosen)
        baseline = sum(rates.baseline(tokens(r[4]), r[0]) for r in chosen) / len(chosen)
        print(
            f"{name}: {len(chosen)} puzzles, accuracy {accuracy:.4f}, blind baseline "
            f"{baseline:.4f}, mean reward {accuracy - baseline:+.4f}"
        )


if __name__ == "__main__":
    main()
