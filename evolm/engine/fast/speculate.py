"""Exact speculative decoding of greedy rows in the tail of a generation (``server.speculate``).

A generation's last decode steps serve a few long rows: the batch is tiny, the GPU waits on
latency, and those steps took most of the decode time on the real workload (issue 37: ~1,056
steps a generation where rows average 58 tokens). There, each step instead feeds a row its
current token plus ``k`` drafted tokens in one forward and keeps the longest prefix of drafts
that greedy decoding would have chosen, plus the token after it: 1 to ``k + 1`` tokens a step,
the same tokens as plain greedy decoding (each kept token is the argmax after exactly the tokens
before it). Every slot has ``k`` cache positions past the widest budget, so every row drafts
``k`` tokens up to its last one (those past its budget are never kept).

Drafts come from the row itself (:class:`NgramDrafter`, prompt lookup decoding): the latest
earlier occurrence of the row's last ``n`` tokens (``n`` = 3, 2, 1) and the tokens that followed
it. Loops, repeated formats and a search that rewrites its candidates repeat themselves.

The verify forward is the decode step's own (:meth:`ModelRunner.verify_forward
<evolm.engine.fast.runner.ModelRunner.verify_forward>`): a row's ``k + 1`` tokens are ``k + 1``
rows of the step, each writing its K/V and attending as a decode step would, captured as CUDA
graphs per bucket. The rest of a verify step runs eagerly and syncs once (the kept tokens
extend the drafter's history on the host). A row's history is indexed once, with numpy, when it
enters the tail (an H100 run's tail starts with ~600 rows of ~1,600 tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress

import numpy as np
import torch
from torch import Tensor

from evolm.engine.fast.lora import FastLora
from evolm.engine.fast.runner import ModelRunner, Rows
from evolm.engine.fast.workspace import Workspace, bucket

MAX_NGRAM = 3


BITS = 21
"""Bits of a token id in an n-gram's key: three ids (below 2**21) make one int64."""


def _keys(tokens: np.ndarray, n: int) -> np.ndarray:
    """The key of each ``n``-gram of ``tokens``, the one starting at index ``i`` at ``i``."""
    keys = tokens[: len(tokens) - n + 1].copy()
    for j in range(1, n):
        keys = (keys << BITS) | tokens[j : len(tokens) - n + 1 + j]
    return keys


def _key(tokens: list[int]) -> int:
    key = 0
    for t in tokens:
        key = (key << BITS) | t
    return key


@dataclass
class History:
    """One row's tokens (prompt and completion, the current token last) and, for each n-gram
    that ends before the last token (by its key, per ``n``), where the tokens after its latest
    occurrence start."""

    tokens: list[int]
    after: tuple[dict[int, int], ...] = field(default_factory=lambda: ({}, {}, {}))
    indexed: int = 0  # n-grams ending before this index are in ``after``

    def extend(self, new: list[int]) -> None:
        if new and not 0 <= min(new) <= max(new) < 1 << BITS:
            raise ValueError(f"token ids must be in 0..2**{BITS}: {min(new)}..{max(new)}")
        self.tokens += new
        toks, end = self.tokens, len(self.tokens) - 1  # never the last token's own n-grams
        if end - self.indexed > 16:  # a prompt: its n-grams at once, later ones overwriting
            base = max(0, self.indexed - MAX_NGRAM + 1)
            arr = np.asarray(toks[base:end], dtype=np.int64)
            for n in range(1, MAX_NGRAM + 1):
                ends = np.arange(base + n - 1, end)  # the last index of each n-gram
                keep = ends >= self.indexed
                keys, after = _keys(arr, n)[keep].tolist(), (ends[keep] + 1).tolist()
                self.after[n - 1].update(zip(keys, after, strict=True))
        else:
            for e in range(self.indexed, end):
                for n in range(1, min(MAX_NGRAM, e + 1) + 1):
                    self.after[n - 1][_key(toks[e - n + 1 : e + 1])] = e + 1
        self.indexed = max(self.indexed, end)

    def draft(self, k: int) -> list[int]:
        """``k`` tokens: what followed the latest earlier occurrence of the longest suffix
        found (padded with its last token), else the last token repeated."""
        toks = self.tokens
        for n in range(min(MAX_NGRAM, len(toks)), 0, -1):
            at = self.after[n - 1].get(_key(toks[-n:]))
            if at is not None:
                cont = toks[at : at + k]
                return cont + [cont[-1]] * (k - len(cont))
        return [toks[-1]] * k


class NgramDrafter:
    """The :class:`History` of each slot in the tail (dropped when its row finishes)."""

    def __init__(self) -> None:
        self.rows: dict[int, History] = {}

    def __contains__(self, slot: int) -> bool:
        return slot in self.rows

    def start(self, slot: int, tokens: list[int]) -> None:
        history = History([])
        history.extend(tokens)
        self.rows[slot] = history

    def extend(self, slot: int, tokens: list[int]) -> None:
        self.rows[slot].extend(tokens)

    def draft(self, slot: int, k: int) -> list[int]:
        return self.rows[slot].draft(k)

    def drop(self, slot: int) -> None:
        self.rows.pop(slot, None)


@dataclass
class SpecStats:
    """Verify steps, and the tokens they drafted and kept (``time/engine_spec_*``)."""

    steps: int = 0
    rows: int = 0
    drafted: int = 0
    kept: int = 0

    def timings(self) -> dict[str, float]:
        if not self.steps:
            return {}
        return {
            "spec_steps": float(self.steps),
            "spec_rows": float(self.rows),  # rows of all verify steps
            "spec_drafted": float(self.drafted),
            "spec_kept": float(self.kept),  # tokens a verify step produced, the bonus included
        }


class Speculator:
    """Verify steps over a :class:`Workspace`'s active slots (see the module docstring).

    Args:
        runner: runs the verify forward (:meth:`ModelRunner.verify_forward`).
        k: tokens drafted per row and step.
    """

    def __init__(self, runner: ModelRunner, k: int) -> None:
        self.runner, self.k = runner, k
        self.drafter = NgramDrafter()
        self.stats = SpecStats()

    def _histories(self, ws: Workspace, slots: list[int], rows: Rows) -> None:
        """Start the history of each slot new to the tail: its prompt and its tokens so far
        (the current token, not yet in the cache, last); one copy to the host for all."""
        new = [s for s in slots if s not in self.drafter]
        if not new:
            return
        idx = torch.tensor(new, dtype=torch.long, device=ws.device)
        row = ws.row[idx]
        ids, mask = rows.ids[row].tolist(), rows.mask[row].tolist()
        outs, gens = rows.out[:-1].view(-1, rows.widest)[row].tolist(), ws.gen[idx].tolist()
        for slot, prompt, keep, done, n in zip(new, ids, mask, outs, gens, strict=True):
            self.drafter.start(slot, list(compress(prompt, keep)) + done[:n])

    def step(self, ws: Workspace, slots: list[int], lora: FastLora | None, rows: Rows) -> None:
        """One verify step of the live ``slots`` (greedy rows, no forced tokens): each row's
        kept tokens into ``rows.out``, its state advanced as that many plain steps would."""
        dev = ws.device
        self._histories(ws, slots, rows)
        sel = torch.tensor(slots, dtype=torch.long, device=dev)
        gen, budget, pos, lo = ws.gen[sel], ws.budget[sel], ws.lens[sel], ws.start[sel]
        # a row's k + 1 tokens fit its slot (the scheduler plans k positions past every
        # budget, so a row near its budget keeps the others' k: tokens past a budget are never
        # kept) and one forward
        fits = int((ws.positions - pos).min())
        k = max(0, min(self.k, fits - 1, ws.slots - 1))
        width = k + 1
        drafts = [self.drafter.draft(s, k) for s in slots] if k else [[] for _ in slots]
        tokens = torch.cat(
            [ws.tok[sel][:, None], torch.tensor(drafts, dtype=torch.long, device=dev)], 1
        )
        at = pos[:, None] + torch.arange(width, device=dev)
        member = ws.member[sel]
        chosen = torch.empty_like(tokens)
        per = ws.slots // width  # rows a forward: its verify rows never pass the planned slots
        for first in range(0, len(slots), per):
            part = slice(first, first + per)
            chosen[part] = self._verify(
                ws, sel[part], at[part], lo[part], tokens[part], member[part], lora
            )
        # drafts kept: the leading ones greedy chose; then the token greedy chose after them
        agree = (tokens[:, 1:] == chosen[:, :-1]).long().cumprod(1).sum(1)
        row, live = ws.row[sel], ~ws.done[sel]
        kept = torch.zeros_like(gen)
        state, done = ws.stop[sel], ~live
        for j in range(width):  # token j of each row, as plain step j would take it
            take = live & (agree >= j)
            finished, state = rows.emit(chosen[:, j], take, row, gen + kept, budget, state)
            kept += take.long()
            done = done | finished
            live = live & ~finished
        last = chosen.gather(1, (kept - 1).clamp(min=0)[:, None])[:, 0]
        ws.tok[sel] = torch.where(kept > 0, last, ws.tok[sel])
        ws.gen[sel], ws.lens[sel], ws.stop[sel], ws.done[sel] = gen + kept, pos + kept, state, done
        counts, picked = kept.tolist(), chosen.tolist()
        for slot, n_kept, toks in zip(slots, counts, picked, strict=True):
            self.drafter.extend(slot, toks[:n_kept])
        self.stats.steps += 1
        self.stats.rows += len(slots)
        self.stats.drafted += k * len(slots)
        self.stats.kept += sum(counts)

    def _verify(
        self,
        ws: Workspace,
        sel: Tensor,
        at: Tensor,
        lo: Tensor,
        tokens: Tensor,
        member: Tensor,
        lora: FastLora | None,
    ) -> Tensor:
        """Greedy's choice after each of ``tokens [rows, width]`` (row ``b`` in cache row
        ``sel[b]``, token ``t`` at position ``at[b, t]``): row ``b``'s tokens are verify rows
        ``b * width .. b * width + width - 1`` of one decode forward, padded to a bucket of the
        slots with the scratch slot (writing at its position 0, in the last row's member)."""
        rows, width = tokens.shape
        v, n = ws.verify, rows * width
        size = bucket(ws.slots, n)
        v.slot[n:size], v.pos[n:size], v.lo[n:size], v.tok[n:size] = ws.slots, 0, 0, 0
        v.slot[:n] = sel.repeat_interleave(width)
        v.pos[:n] = at.reshape(-1)
        v.lo[:n] = lo.repeat_interleave(width)
        v.tok[:n] = tokens.reshape(-1)
        v.member[:n] = member.repeat_interleave(width)
        v.member[n:size] = v.member[n - 1]
        self.runner.verify_forward(ws, size, lora)
        return v.next[:n].view(rows, width)
