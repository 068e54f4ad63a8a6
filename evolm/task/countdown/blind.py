"""What a model's own answers would score without reading the target: the blind baseline.

The fixed templates of :mod:`evolm.task.countdown.shortcuts` name the shortcuts we thought of.
A model can find others: issue 36's 1.5B wrote ``(x + y) - z`` with the numbers ranked by size,
choosing among a few such sign rules, right on each about as often as that rule is on every
puzzle. This module measures any such habit, named or not, from the answers themselves.

An answer's **form** is its expression with each number replaced by its place: in the puzzle's
order (``(a + b) - c``) or among the numbers ranked largest first (``(r1 + r2) - r3``). A form
can be applied to any puzzle of the same size. Its **blind rate** on a set of puzzles is the
share of that size's puzzles it solves, the higher of the two orders: what writing that form
scores when the target is never read. Per answer, the blind rate of its form (0 when it does not
use each number exactly once, as the reward requires); over an evaluation:

* ``blind_accuracy``: the mean blind rate of the answers, what the same forms written blindly
  would score; and
* ``accuracy_lift``: accuracy minus that, the part of the accuracy that comes from choosing a
  form for each puzzle. A model that writes a few rules, whatever the puzzle, has a lift near
  0 (issue 36's runs: -0.4..+0.7 points, within one standard error); one that solves has a
  large lift (the solver's answers to the paper's test puzzles: 99.3%, their forms blindly
  8.6%).

:meth:`BlindRates.baseline` is what ``task.blind_baseline=true`` subtracts from a completion's
reward: the blind mean of ``correct + closeness_weight * closeness``
(:func:`~evolm.task.countdown.reward.closeness_of`), the better of the two orders; with
``closeness_weight=0`` it is the blind rate.

Forms are evaluated on every puzzle at once in float64 (NumPy); the reward's tolerance decides.
That is exact for ``+``, ``-`` and ``*`` over the puzzles' integers; divisions round like any
float, far inside the tolerance.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from evolm.task.countdown.reward import TOLERANCE, closeness_of
from evolm.task.countdown.shortcuts import placed

__all__ = ["BlindRates", "form_tokens"]

_OPS = frozenset("+-*/()")


def form_tokens(tokens: Sequence[str], numbers: Sequence[int]) -> tuple[str, ...] | None:
    """``tokens`` (an answer's, :func:`~evolm.task.countdown.reward.parse_answer`) with each
    number replaced by ``#i``, ``i`` its place in ``numbers``
    (:func:`~evolm.task.countdown.shortcuts.placed`); ``None`` unless every number of
    ``numbers`` is used exactly once and every other token is an operator or a parenthesis (the
    form becomes code in :func:`_evaluate`)."""
    marked = placed(tokens, numbers)
    places = [tok for tok in marked if isinstance(tok, int)]
    if sorted(places) != list(range(len(numbers))):
        return None
    if any(tok not in _OPS for tok in marked if isinstance(tok, str)):
        return None
    return tuple(tok if isinstance(tok, str) else f"#{tok}" for tok in marked)


class BlindRates:
    """The blind rates of answer forms on one set of puzzles (see the module doc).

    Args:
        puzzles: ``(numbers, target)`` per puzzle; repeats count once.
        closeness_weight: the weight of closeness in :meth:`baseline` (the task's
            ``closeness_weight``).
    """

    def __init__(
        self, puzzles: Sequence[tuple[Sequence[int], float]], closeness_weight: float = 0.0
    ) -> None:
        self.closeness_weight = closeness_weight
        by_size: dict[int, set[tuple[tuple[int, ...], float]]] = defaultdict(set)
        for numbers, target in puzzles:
            by_size[len(numbers)].add((tuple(numbers), float(target)))
        self._pools: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for size, found in by_size.items():
            ordered = sorted(found)  # the same arrays whatever the puzzles' order
            numbers = np.array([n for n, _ in ordered], dtype=np.float64)
            targets = np.array([t for _, t in ordered], dtype=np.float64)
            self._pools[size] = numbers, -np.sort(-numbers, axis=1), targets
        self._rates: dict[tuple[int, int, tuple[str, ...]], tuple[float, float]] = {}

    def of_answer(self, tokens: Sequence[str] | None, numbers: Sequence[int]) -> float:
        """The blind rate of one answer's form (0 for no answer, or one that does not use each
        of ``numbers`` exactly once)."""
        return max((rate for rate, _ in self._both_orders(tokens, numbers)), default=0.0)

    def baseline(self, tokens: Sequence[str] | None, numbers: Sequence[int]) -> float:
        """The blind mean of ``correct + closeness_weight * closeness`` of one answer's form,
        the better order's (0 for no answer, or one that does not use each number once)."""
        w = self.closeness_weight
        return max((r + w * c for r, c in self._both_orders(tokens, numbers)), default=0.0)

    def _both_orders(
        self, tokens: Sequence[str] | None, numbers: Sequence[int]
    ) -> list[tuple[float, float]]:
        """``(blind rate, blind mean closeness)`` of the answer's form in each order."""
        size = len(numbers)
        if tokens is None or size not in self._pools:
            return []
        in_order = form_tokens(tokens, numbers)
        if in_order is None:
            return []
        by_size = form_tokens(tokens, sorted(numbers, reverse=True))
        return [self._rate(size, 0, in_order), self._rate(size, 1, by_size)]

    def _rate(self, size: int, order: int, form: tuple[str, ...] | None) -> tuple[float, float]:
        """The share of the puzzles of ``size`` that ``form`` solves over their numbers in
        ``order`` (0: the puzzle's, 1: largest first), and its mean closeness to their targets."""
        if form is None:
            return 0.0, 0.0
        key = (size, order, form)
        if key not in self._rates:
            columns, targets = self._pools[size][order], self._pools[size][2]
            values = _evaluate(form, columns)
            with np.errstate(invalid="ignore"):
                correct = np.abs(values - targets) < TOLERANCE
            near = closeness_of(values, targets)
            self._rates[key] = float(np.mean(correct)), float(np.mean(near))
        return self._rates[key]


def _evaluate(form: Sequence[str], columns: np.ndarray) -> np.ndarray:
    """The form's value on every row of ``columns`` (NaN or inf where it divides by zero): the
    form's tokens are whitelisted (``#i``, operators, parentheses) and become a Python
    expression over the columns."""
    text = " ".join(f"x[:, {tok[1:]}]" if tok.startswith("#") else tok for tok in form)
    try:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            value = eval(text, {"__builtins__": {}}, {"x": columns})
    except (SyntaxError, ZeroDivisionError, TypeError):
        return np.full(columns.shape[0], np.nan)
    return np.broadcast_to(np.asarray(value, dtype=np.float64), (columns.shape[0],))
