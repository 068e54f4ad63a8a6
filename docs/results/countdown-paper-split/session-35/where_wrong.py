"""Where the uniform template-free set's answers go wrong, by family (session 35, CPU).

Reads the committed outside checks (plain transformers + peft, bf16, one H100) of the 0.5B's
three z5 draws, its base, and the 1.5B's p1 / p1c / base, and sorts each answer to a `+`/`-`
(``addsub``) or `*`/`/` (``muldiv``) puzzle into: right; no answer (no ``<answer>`` tag: the
search ran to the token budget or stopped); or a wrong answer, which for the worked examples'
``Try a + b = c, then ...: yes`` form is split by the last try called ``yes``:
  - ``yes, the try misses``: its arithmetic is right and it does not reach the target;
  - ``yes, arithmetic slip``: a step's result is wrong (``87 - 19 = 64``);
  - ``yes, other numbers``: right arithmetic, the target reached, not the puzzle's numbers;
  - ``yes, answer differs``: a valid try (the puzzle's numbers once each, right arithmetic,
    the target) and an answer that is another expression;
  - ``wrong, no yes``: an answer with no ``yes`` try before it (the 1.5B's own format).

Run from the checkout's root (its output: ``where_wrong.txt``):
``PYTHONPATH=. python docs/results/countdown-paper-split/session-35/where_wrong.py``.
"""

from __future__ import annotations

import json
import lzma
import re
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

from evolm.task.countdown.reward import answer_reward, extract_answer
from evolm.task.countdown.shortcuts import classify

HERE = Path(__file__).resolve().parent.parent
CHECKS = {  # name: the outside check of the uniform template-free set (200 puzzles)
    "0.5B base": "session-28/base-uniform_free-outside-check-h100.json.xz",
    "z5": "session-27/z5-uniform_free-outside-check-h100.json.xz",
    "z5s1": "session-28/z5s1-uniform_free-outside-check-h100.json.xz",
    "z5s2": "session-34/z5s2-uniform_free-outside-check-h100.json.xz",
    "1.5B base": "session-31/base15-uniform_free-outside-check-h100.json.xz",
    "p1": "session-31/p1-uniform_free-outside-check-h100.json.xz",
    "p1c": "session-32/p1c-uniform_free-outside-check-h100.json.xz",
}
STEP = re.compile(r"(-?\d+)\s*([-+*/])\s*(-?\d+)\s*=\s*(-?\d+(?:\.\d+)?)")


def _apply(a: Fraction, op: str, b: Fraction) -> Fraction | None:
    if op == "/":
        return a / b if b else None
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def last_yes(completion: str) -> str | None:
    """The last ``Try ...: yes`` of the reasoning (its text up to the verdict), or None."""
    tries = completion.split("</think>")[0].split("Try ")
    yes = [t for t in tries if re.search(r":\s*yes", t)]
    return yes[-1].split(":")[0] if yes else None


def yes_kind(attempt: str, numbers: Sequence[int], target: str) -> str:
    """How a ``yes`` try that is not the answer's failure went (see the module doc)."""
    steps = STEP.findall(attempt)
    if not steps:
        return "yes, unread"
    used: Counter[int] = Counter()
    prev: Fraction | None = None
    slip = chained = False
    for k, (a, op, b, c) in enumerate(steps):
        x, y = Fraction(int(a)), Fraction(int(b))
        slip |= _apply(x, op, y) != Fraction(c)
        if k == 0:
            used.update((int(a), int(b)))
        elif x == prev:
            used[int(b)] += 1
        elif y == prev:
            used[int(a)] += 1
        else:
            chained = True
        prev = Fraction(c)
    if slip:
        return "yes, arithmetic slip"
    if Fraction(steps[-1][3]) != Fraction(target):
        return "yes, the try misses"
    if chained or used != Counter(numbers):
        return "yes, other numbers"
    return "yes, answer differs"


def kind(numbers: Sequence[int], target: str, completion: str) -> str:
    if answer_reward(completion, numbers, target) > 0:
        return "right"
    if extract_answer(completion) is None:
        return "no answer"
    attempt = last_yes(completion)
    return "wrong, no yes" if attempt is None else yes_kind(attempt, numbers, target)


def main() -> None:
    for name, path in CHECKS.items():
        with lzma.open(HERE / path) as f:
            answers = json.load(f)["answers"]
        by_family: dict[str, Counter[str]] = {"addsub": Counter(), "muldiv": Counter()}
        for r in answers:
            family = classify(r["numbers"], r["target"]).family
            if family in by_family:
                by_family[family][kind(r["numbers"], str(r["target"]), r["completion"])] += 1
        for family, counts in by_family.items():
            total = sum(counts.values())
            print(f"{name:10s} {family} ({total}): {dict(counts.most_common())}")


if __name__ == "__main__":
    main()
