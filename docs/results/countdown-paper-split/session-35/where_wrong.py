"""Where the uniform template-free set's answers go wrong, by family (session 35, CPU).

Reads the committed outside checks (plain transformers + peft, bf16, one H100) of the 0.5B's
three z5 draws, za (session 36), its base, and the 1.5B's p1 / p1c / base, and sorts each
completion to a `+`/`-` (``addsub``) or `*`/`/` (``muldiv``) puzzle by its answer (the
reward's: the last closed ``<answer>...</answer>`` pair) and, for the worked examples' ``Try
a + b = c, then ...: yes`` form, by the last try called ``yes``:
  - ``right``: the answer is right; ``right, last yes false``: so is it, though the last try
    called ``yes`` is not a valid one (below);
  - ``no answer``: no answer pair (the search ran to the token budget, or stopped);
  - ``yes at a result not the target``: a wrong answer after a ``yes`` at a try whose own
    written result is not the target (``87 - 19 = 68: yes`` for 64), its arithmetic right or
    not;
  - ``yes at the target by a slip``: the try's written result is the target, a step's
    arithmetic is wrong;
  - ``yes at the target, other numbers``: right arithmetic, the target, not the puzzle's
    numbers once each;
  - ``valid yes try, another answer``: a valid try (the puzzle's numbers once each, right
    arithmetic, the target) and a wrong answer (often the puzzle's order);
  - ``yes, unread``: a ``yes`` try with no step this script reads;
  - ``wrong, no yes``: a wrong answer with no ``yes`` try before it (the 1.5B's own format).
The answer written after a ``yes`` is often not that try's expression: these columns say where
the search stopped, not what was copied.

Known limits (none touches the `+`/`-` rows' counts): a step whose first number is a decimal
(``12.5 * 4 = 50``) is read from its integer tail; a rounded division (``17 / 3 = 5.67``) counts
as a slip; a try that combines two separate results (``a + b``, ``c + d``, then both) counts as
other numbers.

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

from evolm.task.countdown.reward import answer_reward, evaluate_expression, extract_answer
from evolm.task.countdown.shortcuts import classify

RESULTS = Path(__file__).resolve().parent.parent  # countdown-paper-split/
CHECKS = {  # name: the outside check of the uniform template-free set (200 puzzles)
    "0.5B base": "session-28/base-uniform_free-outside-check-h100.json.xz",
    "z5": "session-27/z5-uniform_free-outside-check-h100.json.xz",
    "z5s1": "session-28/z5s1-uniform_free-outside-check-h100.json.xz",
    "z5s2": "session-34/z5s2-uniform_free-outside-check-h100.json.xz",
    "za": "session-36/za-uniform_free-outside-check-h100.json.xz",
    "1.5B base": "session-31/base15-uniform_free-outside-check-h100.json.xz",
    "p1": "session-31/p1-uniform_free-outside-check-h100.json.xz",
    "p1c": "session-32/p1c-uniform_free-outside-check-h100.json.xz",
}
STEP = re.compile(r"(-?\d+)\s*([-+*/])\s*(-?\d+)\s*=\s*(-?\d+(?:\.\d+)?)")


def last_yes(completion: str) -> str | None:
    """The last ``Try ...: yes`` of the reasoning (its text up to the verdict), or None."""
    tries = completion.split("</think>")[0].split("Try ")
    yes = [t for t in tries if re.search(r":\s*yes", t)]
    return yes[-1].split(":")[0] if yes else None


def try_kind(attempt: str, numbers: Sequence[int], target: str) -> str:
    """What a try called ``yes`` is (the module doc's names): ``valid`` for a valid one."""
    steps = STEP.findall(attempt)
    if not steps:
        return "yes, unread"
    if Fraction(steps[-1][3]) != Fraction(target):
        return "yes at a result not the target"
    used: Counter[int] = Counter()
    prev: Fraction | None = None
    slip = unchained = False
    for k, (a, op, b, c) in enumerate(steps):
        x, y = Fraction(int(a)), Fraction(int(b))
        slip |= evaluate_expression(f"{a} {op} {b}") != Fraction(c)
        if k == 0:
            used.update((int(a), int(b)))
        elif x == prev:
            used[int(b)] += 1
        elif y == prev:
            used[int(a)] += 1
        else:
            unchained = True
        prev = Fraction(c)
    if slip:
        return "yes at the target by a slip"
    if unchained or used != Counter(numbers):
        return "yes at the target, other numbers"
    return "valid"


def kind(numbers: Sequence[int], target: str, completion: str) -> str:
    """One completion's row of the table (the module doc's names)."""
    attempt = last_yes(completion)
    tried = None if attempt is None else try_kind(attempt, numbers, target)
    if answer_reward(completion, numbers, target) > 0:
        return "right" if tried in (None, "valid") else "right, last yes false"
    if extract_answer(completion) is None:
        return "no answer"
    if tried is None:
        return "wrong, no yes"
    return "valid yes try, another answer" if tried == "valid" else tried


def main() -> None:
    for name, path in CHECKS.items():
        with lzma.open(RESULTS / path) as f:
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
