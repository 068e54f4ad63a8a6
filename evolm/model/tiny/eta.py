"""The expected time left of a warm-up whose steps differ in cost
(:mod:`evolm.model.tiny.pretrain`).

The countdown warm-up runs three kinds of steps: a block of short-prompt steps first, then
question/answer and full-prompt steps mixed. A single rate measured on the first block would
misjudge the rest (a full-prompt step costs about 1.6 times a short one, a question/answer step
half), so every kind is estimated on its own: its mean measured step time once it has run,
before that its :func:`step_work` times the seconds per unit of work of the steps done so far.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

ATTENTION_SPAN = 256
"""Sequence length at which attention costs as much again as the rest of a token's work, in
the cost model of :func:`step_work` (fitted on the tiny model's three step kinds, one thread)."""


def step_work(rows: int, seq_len: int) -> float:
    """The relative cost of a training step over ``rows`` sequences of ``seq_len`` tokens: per
    token, the projections plus attention growing with the length."""
    return rows * seq_len * (1.0 + seq_len / ATTENTION_SPAN)


class Eta:
    """Seconds left of a run of steps of known kinds (``kinds``, in order) whose relative costs
    are ``work`` (:func:`step_work` by kind)."""

    def __init__(self, kinds: Sequence[str], work: Mapping[str, float]) -> None:
        self.left = Counter(kinds)
        self.work = dict(work)
        self.done: Counter[str] = Counter()
        self.spent: dict[str, float] = dict.fromkeys(self.work, 0.0)

    def step(self, kind: str, seconds: float) -> None:
        """One step of ``kind`` took ``seconds``."""
        self.left[kind] -= 1
        self.done[kind] += 1
        self.spent[kind] += seconds

    def seconds_left(self) -> float:
        """The expected seconds of the steps not run yet (NaN before any step ran)."""
        work_done = sum(n * self.work[k] for k, n in self.done.items())
        if work_done <= 0:
            return math.nan
        per_work = sum(self.spent.values()) / work_done
        return sum(
            n * (self.spent[k] / self.done[k] if self.done[k] else per_work * self.work[k])
            for k, n in self.left.items()
            if n > 0
        )


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 20 s``, ``1 h 05 min`` (whole seconds; ``?`` when unknown)."""
    if not math.isfinite(seconds):
        return "?"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"
