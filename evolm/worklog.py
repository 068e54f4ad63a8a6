"""How long each prompt's completions ran at its last visit: the expected work of its rows now.

A run visits the same prompts again and again (Countdown trains on the same 200 prompts every
generation, or cycles through them; the eval prompts come back at every eval), and its members
are small perturbations of one mean, so a prompt's mean completion length over the members at
its last visit predicts its rows' lengths now. :func:`evolm.evaluate.evaluate` schedules rows by
it (``expected``): longest first, and balanced over the ranks of a process group.

Prompts are keyed by a 62-bit digest of their rendered text (:func:`key`: the same in every
process, unlike ``hash()``), at most ``cap`` of them (the least recently visited go first), so
the checkpoint carries a few thousand numbers at most (:meth:`WorkLog.state_dict`): a resumed
run schedules exactly as the uninterrupted one.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

CAP = 2048
"""Prompts remembered (Countdown's paper setup: 200 training prompts plus the eval split)."""


def key(prompt: str) -> int:
    """A prompt's 62-bit digest (blake2b of its UTF-8 text)."""
    return int.from_bytes(hashlib.blake2b(prompt.encode(), digest_size=8).digest(), "big") >> 2


class WorkLog:
    """Per prompt (its rendered text), the mean completion length over members at its last
    visit; :class:`evolm.callbacks.Stateful` (a checkpoint carries it)."""

    def __init__(self, cap: int = CAP) -> None:
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        self.cap = cap
        self._last: dict[int, float] = {}  # digest -> length, least recently visited first

    def __len__(self) -> int:
        return len(self._last)

    def expected(self, prompts: Sequence[str]) -> list[float] | None:
        """Each prompt's expected completion length: its last visit's, or (never seen) the mean
        of the known ones; None when none is known (schedule as without a history)."""
        keys = [key(p) for p in prompts]
        known = [self._last[k] for k in keys if k in self._last]
        if not known:
            return None
        fill = sum(known) / len(known)
        return [self._last.get(k, fill) for k in keys]

    def record(self, prompts: Sequence[str], lengths: Sequence[float]) -> None:
        """Remember a visit: ``lengths`` per (member, prompt) row, member-major (every member
        answered every prompt); non-finite means are not recorded."""
        n = len(prompts)
        if n == 0:
            return
        if len(lengths) % n:
            raise ValueError(f"{len(lengths)} row lengths for {n} prompts")
        members = len(lengths) // n
        if members == 0:
            return
        for p, text in enumerate(prompts):
            mean = sum(lengths[m * n + p] for m in range(members)) / members
            if not math.isfinite(mean):
                continue
            k = key(text)
            self._last.pop(k, None)  # re-inserted last: the most recently visited
            self._last[k] = float(mean)
        while len(self._last) > self.cap:
            del self._last[next(iter(self._last))]

    def state_dict(self) -> dict[str, Any]:
        """The history as builtins (oldest visit first)."""
        return {"prompts": list(self._last), "lengths": list(self._last.values())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the newest ``cap`` entries)."""
        keys, values = list(state["prompts"]), list(state["lengths"])
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} prompts with {len(values)} lengths")
        pairs = list(zip(keys, values, strict=True))[-self.cap :]
        self._last = {int(k): float(v) for k, v in pairs}
