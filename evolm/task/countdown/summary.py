"""Countdown's set-level numbers: how much of an accuracy a shortcut explains.

:func:`shortcut_summary` is what :meth:`evolm.task.countdown.Countdown.summarize` returns for
one evaluation (the population's rows, or the mean's); names and meanings are in
:mod:`evolm.metrics`. Rows are member-major (a prompt repeats once per member), so a
puzzle-level rate over rows equals the rate over the distinct prompts. A subset with no rows
(no correct answer, no puzzle of a family) leaves its key out: never a NaN.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence

from evolm import metrics as M
from evolm.task.countdown.shortcuts import FAMILIES, NEGATED, RANKED, TEMPLATES, PuzzleInfo

__all__ = ["family_shares", "puzzle_rates", "shortcut_summary"]

BY_SIZE = "by_size"
"""``shortcut/by_size``: the best size-order rule per puzzle size."""
FIRST_NEGATED = "first_negated"
"""``shortcut/first_negated``: the best first-negated rule per puzzle size (``-a + b + c``)."""

ACCURACY_FAMILIES = ("template", "addsub", "muldiv")
"""The families whose accuracy is logged (an unsolvable puzzle's is 0 by definition)."""
NO_RULE = "no_rule"
"""``accuracy/no_rule``: the puzzles no fixed rule solves (in the puzzle's order, by size, or
with the first number negated)."""


def puzzle_rates(infos: Sequence[PuzzleInfo]) -> dict[str, float]:
    """What templates score on these puzzles, whatever a model answered: ``shortcut_accuracy``
    (the best fixed rule per puzzle size, over the puzzle's order, the size order or the
    first number negated, weighted by the sizes' counts), ``shortcut/by_size`` (the best
    size-order rule alone), ``shortcut/first_negated`` (the best first-negated rule alone),
    ``shortcut/<name>`` per named template, and ``template_solvable_share``; empty for no
    puzzles."""
    if not infos:
        return {}
    best = ranked = negated = 0
    for rows in _by_size(infos).values():
        counts = Counter(p for i in rows for p in infos[i].rules)
        best += max(counts.values(), default=0)
        ranked += max((c for p, c in counts.items() if p.startswith(RANKED)), default=0)
        negated += max((c for p, c in counts.items() if p.startswith(NEGATED)), default=0)
    n = len(infos)
    out = {
        M.SHORTCUT_ACCURACY: best / n,
        M.shortcut(BY_SIZE): ranked / n,
        M.shortcut(FIRST_NEGATED): negated / n,
    }
    for name in TEMPLATES:
        out[M.shortcut(name)] = sum(info.solved_by(name) for info in infos) / n
    out[M.TEMPLATE_SOLVABLE_SHARE] = sum(info.template_solvable for info in infos) / n
    return out


def family_shares(infos: Sequence[PuzzleInfo]) -> dict[str, float]:
    """The share of the puzzles in each family (:data:`FAMILIES`; ``unsearched``: too large to
    search, only when there are such puzzles)."""
    counts = Counter(info.family or "unsearched" for info in infos)
    names = [*FAMILIES, *(["unsearched"] if counts["unsearched"] else [])]
    return {f: counts[f] / len(infos) for f in names} if infos else {}


def shortcut_summary(
    infos: Sequence[PuzzleInfo],
    correct: Sequence[float],
    template_answer: Sequence[float],
    forms: Sequence[float],
    blind: Sequence[float] = (),
    answered: Sequence[float] = (),
) -> dict[str, float]:
    """The set-level numbers of one evaluation: per row, the puzzle (``infos``), whether the
    answer is correct (1/0), whether it is a template answer (1/0), its form's code
    (:func:`~evolm.task.countdown.shortcuts.form_code`; NaN: no answer that parses), its
    form's blind rate (:mod:`evolm.task.countdown.blind`) and whether the completion gives an
    answer (1/0; these last two, none given: their numbers left out)."""
    out = puzzle_rates(infos)
    if answered:
        _accuracy(out, M.ANSWERED_SHARE, answered)
        given = [c for a, c in zip(answered, correct, strict=True) if a > 0.5]
        _accuracy(out, M.ANSWER_PRECISION, given)
    if blind:
        out[M.BLIND_ACCURACY] = sum(blind) / len(blind)
        out[M.ACCURACY_LIFT] = sum(c > 0.5 for c in correct) / len(correct) - out[M.BLIND_ACCURACY]
    beyond = [c for info, c in zip(infos, correct, strict=True) if not info.template_solvable]
    _accuracy(out, M.ACCURACY_BEYOND_SHORTCUTS, beyond)
    free = [c for info, c in zip(infos, correct, strict=True) if not info.rule_solvable]
    _accuracy(out, M.subset_accuracy(NO_RULE), free)
    right = [t for c, t in zip(correct, template_answer, strict=True) if c > 0.5]
    if right:
        out[M.TEMPLATE_SHARE] = sum(t > 0.5 for t in right) / len(right)
    sizes = _by_size(infos)
    parsed = [[forms[i] for i in rows if not math.isnan(forms[i])] for rows in sizes.values()]
    if any(parsed):
        top = sum(Counter(codes).most_common(1)[0][1] for codes in parsed if codes)
        out[M.ANSWER_FORM_TOP_SHARE] = top / sum(len(codes) for codes in parsed)
    for family in ACCURACY_FAMILIES:
        rows = [c for info, c in zip(infos, correct, strict=True) if info.family == family]
        _accuracy(out, M.subset_accuracy(family), rows)
    for size, rows in sorted(sizes.items()):
        _accuracy(out, M.subset_accuracy(M.size_subset(size)), [correct[i] for i in rows])
    return out


def _by_size(infos: Sequence[PuzzleInfo]) -> dict[int, list[int]]:
    """The row indices of each puzzle size."""
    out: dict[int, list[int]] = defaultdict(list)
    for i, info in enumerate(infos):
        out[info.size].append(i)
    return out


def _accuracy(out: dict[str, float], name: str, correct: Sequence[float]) -> None:
    """``out[name]``: the share of ``correct`` that is 1; left out for no rows."""
    if correct:
        out[name] = sum(c > 0.5 for c in correct) / len(correct)
