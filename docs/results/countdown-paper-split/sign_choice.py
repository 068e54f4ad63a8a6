"""Does a countdown model choose its signs per puzzle, or write a fixed rule?

    python docs/results/countdown-paper-split/sign_choice.py ANSWERS.jsonl[.xz] [...]

ANSWERS: an eval's answers (a run's ``samples/gen-NNN.jsonl``: prompt, completion, scores; or
committed, with ``puzzle``: an id in ../shared/data/countdown/countdown.json). For
each answer written with ``+`` and ``-`` alone over every number of its puzzle once, its **sign
rule** is the sign each number gets, the numbers ranked largest first (``++-``: largest +
middle - smallest, however it is parenthesised or ordered). A rule is computable from the
puzzle alone; its **base rate** is the share of all puzzles of that size (in the same file) it
solves. If the model writes rules without reading the target, its accuracy on the answers that
carry a rule is the mean base rate of the rules it wrote ("expected"); more than that is the part
of its accuracy that comes from choosing the signs per puzzle ("lift").
"""

from __future__ import annotations

import collections
import functools
import sys
from fractions import Fraction
from pathlib import Path

from puzzles import rows

from evolm.task.countdown.reward import (
    TOLERANCE,
    evaluate_expression,
    extract_answer,
    parse_answer,
    parse_target,
)


def read(path: Path) -> list[tuple[list[int], float, dict]]:
    """Each saved answer with its puzzle: ``(numbers, target, row)`` (committed answers name
    the paper's puzzles by id: :mod:`puzzles`)."""
    return [(numbers, parse_target(target), row) for numbers, target, row in rows(path)]


def sign_rule(completion: str, numbers: list[int]) -> str | None:
    """The signs of the numbers ranked largest first, or None (other operators, numbers
    missing or repeated, no answer)."""
    answer = extract_answer(completion)
    parsed = None if answer is None else parse_answer(answer)
    if parsed is None:
        return None
    tokens, value = parsed
    if any(t in "*/" for t in tokens):
        return None
    places = [i for i, t in enumerate(tokens) if t.isdigit()]
    if sorted(int(tokens[i]) for i in places) != sorted(numbers):
        return None
    ranked = sorted(numbers, reverse=True)
    free = list(range(len(ranked)))
    signs = [""] * len(ranked)
    for i in places:  # the coefficient of each number: +1 or -1 in a +/- expression
        bumped = list(tokens)
        bumped[i] = str(int(tokens[i]) + 1)
        delta = evaluate_expression(" ".join(bumped))
        if delta is None:
            return None
        rank = next(r for r in free if ranked[r] == int(tokens[i]))
        free.remove(rank)
        signs[rank] = "+" if delta - value > 0 else "-"
    return "".join(signs)


def rule_solves(rule: str, numbers: list[int], target: float) -> bool:
    ranked = sorted(numbers, reverse=True)
    value = sum(Fraction(n) * (1 if s == "+" else -1) for s, n in zip(rule, ranked, strict=True))
    return abs(float(value) - target) < TOLERANCE


def base_rate(by_size: dict[int, list[tuple[list[int], float]]], rule: str) -> float:
    """The share of the puzzles of the rule's size it solves."""
    pool = by_size[len(rule)]
    return sum(rule_solves(rule, n, t) for n, t in pool) / len(pool)


def main(paths: list[str]) -> None:
    for name in paths:
        puzzles = [
            (nums, target, r["completion"], r["scores"]["accuracy"] > 0)
            for nums, target, r in read(Path(name))
        ]
        by_size = collections.defaultdict(list)
        for nums, target, _, _ in puzzles:
            by_size[len(nums)].append((nums, target))
        rate = functools.cache(functools.partial(base_rate, dict(by_size)))

        ruled = [(sign_rule(c, n), ok) for n, _, c, ok in puzzles]
        with_rule = [(rule, ok) for rule, ok in ruled if rule is not None]
        acc = sum(ok for _, ok in ruled) / len(ruled)
        actual = sum(ok for _, ok in with_rule) / len(with_rule)
        expected = sum(rate(rule) for rule, _ in with_rule) / len(with_rule)
        best = {n: max(rate(s) for s in _rules(n)) for n in by_size}
        best_all = sum(best[n] * len(by_size[n]) for n in by_size) / len(puzzles)
        print(f"== {name}: {len(puzzles)} puzzles, accuracy {acc:.1%}")
        print(
            f"   +/- answers over all numbers: {len(with_rule) / len(puzzles):.1%}; accuracy there "
            f"{actual:.1%}, the base rate of the rules written {expected:.1%}: lift "
            f"{actual - expected:+.1%}; the best fixed sign rule per size alone: {best_all:.1%}"
        )
        counts = collections.Counter(rule for rule, _ in with_rule)
        for rule, k in counts.most_common(8):
            right = sum(ok for r, ok in with_rule if r == rule) / k
            print(
                f"   {rule:5s} {k:5d} answers ({k / len(puzzles):5.1%}): right {right:5.1%}, "
                f"base rate {rate(rule):5.1%}"
            )


def _rules(n: int) -> list[str]:
    return ["+" + "".join(p) for p in _signs(n - 1)] + ["-" + "".join(p) for p in _signs(n - 1)]


def _signs(k: int) -> list[tuple[str, ...]]:
    if k == 0:
        return [()]
    return [(s, *rest) for s in "+-" for rest in _signs(k - 1)]


if __name__ == "__main__":
    main(sys.argv[1:])
