"""An exhaustive Countdown solver: every value a puzzle's numbers can reach, exactly.

A value is *reachable* from a multiset of numbers when some expression uses every number
exactly once with the binary operators ``+ - * /`` (both operand orders, any bracketing) and
evaluates to it; division by zero is no value. Arithmetic is exact (rationals as reduced
``(numerator, denominator)`` pairs of ints: the same values as :class:`fractions.Fraction`, a
tenth of the cost) and a target counts as reached as the reward counts an answer correct:
``|value - target| < TOLERANCE``. Value sets are memoized on the sorted numbers, so
the parts that many puzzles share are searched once: the paper file's 2,000 test puzzles take
about two seconds (one 4-number puzzle: ~1 ms).

Unary minus (which the reward accepts, ``-3 - 5``) is left out, as in the standard search:
``-(e)`` only negates a binary expression ``e``; a puzzle that needs it is ``unsolvable`` here.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from fractions import Fraction
from functools import lru_cache
from math import gcd

from evolm.task.countdown.reward import TOLERANCE

__all__ = ["MAX_SEARCH_NUMBERS", "reaches", "reaches_by_signs", "solve", "values"]

MAX_SEARCH_NUMBERS = 5
"""Puzzles with more numbers are not searched (their value sets grow too fast for a check
that runs during training): :func:`reaches` answers ``None`` for them."""

Rational = tuple[int, int]
"""``(p, q)``: the value ``p / q``, reduced, ``q > 0``."""

_CACHE = 4096
"""Value sets of parts kept (three numbers: ~100 values, 15 KB; four: ~1,000, 190 KB). A
puzzle's own set is not kept: callers keep what they learn per puzzle."""


def _goal(target: float | Fraction) -> Fraction:
    """The target as the reward compares it: the exact image of its float."""
    return target if isinstance(target, Fraction) else Fraction(float(target))


def _splits(ms: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every split of the sorted multiset ``ms`` into two non-empty sorted parts, each unordered
    pair once (the first part holds ``ms[0]``)."""
    rest = ms[1:]
    seen: set[tuple[int, ...]] = set()
    for r in range(len(rest)):  # the first part: ms[0] plus r of the rest (r < all of them)
        for picked in itertools.combinations(range(len(rest)), r):
            left = (ms[0], *(rest[i] for i in picked))
            if left not in seen:
                seen.add(left)
                yield left, tuple(rest[i] for i in range(len(rest)) if i not in picked)


def _reduced(p: int, q: int) -> Rational:
    if q < 0:
        p, q = -p, -q
    g = gcd(p, q)
    return (p // g, q // g) if g > 1 else (p, q)


def _combine(a: Rational, b: Rational) -> Iterator[tuple[str, Rational]]:
    """Every ``a op b`` and ``b op a`` with its shape (``{0}``: a's text, ``{1}``: b's)."""
    (p, q), (r, s) = a, b
    yield "({0} + {1})", _reduced(p * s + r * q, q * s)
    yield "({0} - {1})", _reduced(p * s - r * q, q * s)
    yield "({1} - {0})", _reduced(r * q - p * s, q * s)
    yield "({0} * {1})", _reduced(p * r, q * s)
    if r:
        yield "({0} / {1})", _reduced(p * s, q * r)
    if p:
        yield "({1} / {0})", _reduced(r * q, s * p)


def _search(ms: tuple[int, ...]) -> frozenset[Rational]:
    """Every value reachable from the sorted multiset ``ms`` (its parts' sets memoized)."""
    if len(ms) == 1:
        return frozenset(((ms[0], 1),))
    out: set[Rational] = set()
    add = out.add
    for left, right in _splits(ms):
        rights = _values(right)
        for p, q in _values(left):
            for r, s in rights:  # _combine's six values, inlined (this loop is the search)
                if q == 1 == s:  # both integers (most values): +, -, * need no reduction
                    add((p + r, 1))
                    add((p - r, 1))
                    add((r - p, 1))
                    add((p * r, 1))
                    if r:
                        add(_reduced(p, r))
                    if p:
                        add(_reduced(r, p))
                    continue
                qs, ps, rq = q * s, p * s, r * q
                add(_reduced(ps + rq, qs))
                add(_reduced(ps - rq, qs))
                add(_reduced(rq - ps, qs))
                add(_reduced(p * r, qs))
                if r:
                    add(_reduced(ps, q * r))
                if p:
                    add(_reduced(rq, s * p))
    return frozenset(out)


_values = lru_cache(maxsize=_CACHE)(_search)


def values(numbers: Sequence[int]) -> frozenset[Fraction]:
    """Every value reachable from ``numbers`` (each used exactly once)."""
    return frozenset(Fraction(p, q) for p, q in _search(tuple(sorted(numbers))))


def _near(ms: tuple[int, ...], goal: Fraction) -> Rational | None:
    """A reachable value of ``ms`` within the tolerance of ``goal``, or ``None``."""
    g = goal.numerator / goal.denominator
    for p, q in _search(ms):
        if abs(p / q - g) < 2 * TOLERANCE and abs(Fraction(p, q) - goal) < TOLERANCE:
            return p, q
    return None


def reaches(numbers: Sequence[int], target: float | Fraction) -> bool | None:
    """Whether some expression over all ``numbers`` reaches ``target``; ``None`` for puzzles
    of more than :data:`MAX_SEARCH_NUMBERS` numbers (not searched)."""
    if not numbers or len(numbers) > MAX_SEARCH_NUMBERS:
        return None
    return _near(tuple(sorted(numbers)), _goal(target)) is not None


def reaches_by_signs(numbers: Sequence[int], target: float | Fraction) -> bool:
    """Whether ``+`` and ``-`` alone reach ``target``: ``sum(s_i * n_i)`` for signs with at
    least one ``+`` (the values binary ``+``/``-`` over the numbers give, any order and
    bracketing)."""
    goal = _goal(target)
    for signs in itertools.product((1, -1), repeat=len(numbers)):
        total = sum(s * n for s, n in zip(signs, numbers, strict=True))
        if 1 in signs and abs(total - goal) < TOLERANCE:
            return True
    return False


def solve(numbers: Sequence[int], target: float | Fraction) -> str | None:
    """An expression over all ``numbers`` that reaches ``target`` (fully parenthesised, e.g.
    ``"((19 + 35) + 44)"``), or ``None`` (also for more than :data:`MAX_SEARCH_NUMBERS`)."""
    if not numbers or len(numbers) > MAX_SEARCH_NUMBERS:
        return None
    ms = tuple(sorted(numbers))
    value = _near(ms, _goal(target))
    return None if value is None else _express(ms, value)


def _express(ms: tuple[int, ...], value: Rational) -> str:
    """An expression over ``ms`` whose value is exactly ``value`` (a member of its set)."""
    if len(ms) == 1:
        return str(ms[0])
    for left, right in _splits(ms):
        rights = _values(right)
        for a in _values(left):
            for b in rights:
                for shape, got in _combine(a, b):
                    if got == value:
                        return shape.format(_express(left, a), _express(right, b))
    raise AssertionError(f"{value} is not reachable from {ms}")  # callers pass members only
