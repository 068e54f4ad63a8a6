"""za against what never reads the target (session 36, CPU): the figures of its section.

1. The outside checks of the uniform template-free set (base, z5s2, za): accuracy, what the
   same answers' forms score written blindly (evolm's blind baseline,
   :class:`evolm.task.countdown.blind.BlindRates`, over that set's puzzles) and the lift.
2. za's most written answer forms there, each with its writes, right answers and blind hits
   (the form on every puzzle of its size, in the puzzle's order).
3. On the 783 template-solvable puzzles of the paper's test set (evolm's final eval of z5s2 and
   za): whether the first try takes the puzzle's first two numbers in order (``a ? b``; two
   equal ones count so) or the second first (``b ? a``), and how many of each are right.

Run from the checkout's root, ../shared beside it (its output: ``za_forms.txt``):
``PYTHONPATH=. python docs/results/countdown-paper-split/session-36/za_forms.py``.
"""

from __future__ import annotations

import json
import lzma
import re
import sys
import tarfile
import tempfile
from collections import Counter
from fractions import Fraction
from pathlib import Path

from evolm.task.countdown.blind import BlindRates
from evolm.task.countdown.reward import (
    answer_reward,
    evaluate_expression,
    extract_answer,
    parse_answer,
)
from evolm.task.countdown.shortcuts import classify, completion_shape

RESULTS = Path(__file__).resolve().parent.parent  # countdown-paper-split/
sys.path.insert(0, str(RESULTS))
from puzzles import rows  # noqa: E402  (the paper's puzzles joined back by id)

CHECKS = {
    "0.5B base": "session-28/base-uniform_free-outside-check-h100.json.xz",
    "z5s2": "session-34/z5s2-uniform_free-outside-check-h100.json.xz",
    "za": "session-36/za-uniform_free-outside-check-h100.json.xz",
}
EVALS = {"z5s2": ("session-34/z5s2-answers.tar.xz", 53), "za": ("session-36/za-answers.tar.xz", 56)}
FIRST_TRY = re.compile(r"Try (-?\d+) [-+*/] (-?\d+)")


def right(r: dict) -> bool:
    return answer_reward(r["completion"], r["numbers"], str(r["target"])) > 0


def blind_lift(answers: list[dict]) -> tuple[float, float]:
    """Accuracy and the answers' forms written blindly, over the set's own puzzles."""
    rates = BlindRates([(r["numbers"], float(r["target"])) for r in answers])
    blind = 0.0
    for r in answers:
        answer = extract_answer(r["completion"])
        parsed = None if answer is None else parse_answer(answer)
        blind += rates.of_answer(None if parsed is None else parsed[0], r["numbers"])
    return sum(map(right, answers)) / len(answers), blind / len(answers)


def solves(form: str, numbers: list[int], target: str) -> bool:
    """Whether ``form`` (letters for the puzzle's places) reaches ``target`` on ``numbers``."""
    text = re.sub(r"\b[a-d]\b", lambda m: str(numbers["abcd".index(m.group())]), form)
    try:
        return evaluate_expression(text) == Fraction(target)
    except (ValueError, ZeroDivisionError):
        return False


def main() -> None:
    checks = {}
    for name, path in CHECKS.items():
        with lzma.open(RESULTS / path) as f:
            checks[name] = json.load(f)["answers"]
        acc, blind = blind_lift(checks[name])
        print(f"{name:9s} uniform set: accuracy {acc:.3f}, forms blindly {blind:.4f}, "
              f"lift {acc - blind:+.3f}")
    za = checks["za"]
    writes, hits = Counter(), Counter()
    for r in za:
        shape = completion_shape(r["completion"], r["numbers"])
        key = (len(r["numbers"]), None if shape is None else shape.form)
        writes[key] += 1
        hits[key] += right(r)
    for (size, form), n in writes.most_common(6):
        if form is None:
            print(f"za, {size} numbers: {n} without an answer that parses")
            continue
        pool = [r for r in za if len(r["numbers"]) == size]
        blind = sum(solves(form, r["numbers"], str(r["target"])) for r in pool)
        print(f"za, {size} numbers: {form!r} written {n}, right {hits[size, form]}, "
              f"blindly {blind} of {len(pool)}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (archive, gen) in EVALS.items():
            with tarfile.open(RESULTS / archive) as tar:
                tar.extract(f"samples/gen-{gen:03d}.jsonl", tmp, filter="data")
            tries, good = Counter(), Counter()
            for numbers, target, row in rows(Path(tmp) / f"samples/gen-{gen:03d}.jsonl"):
                if classify(numbers, target).family != "template":
                    continue
                m = FIRST_TRY.search(row["completion"])
                pair = None if m is None else (int(m.group(1)), int(m.group(2)))
                order = ("a ? b" if pair == (numbers[0], numbers[1])
                         else "b ? a" if pair == (numbers[1], numbers[0]) else "other")
                tries[order] += 1
                good[order] += answer_reward(row["completion"], numbers, str(target)) > 0
            print(f"{name:9s} template-solvable test puzzles ({sum(tries.values())}): first "
                  f"try {dict(tries)}, right {dict(good)}")


if __name__ == "__main__":
    main()
