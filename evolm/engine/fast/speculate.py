"""Exact speculative decoding of greedy rows in the tail of a generation (``server.speculate``).

A generation's last decode steps serve a few long rows: the batch is tiny, the GPU waits on
latency, and those steps took most of the decode time on the real workload (issue 37: ~1,056
steps a generation where rows average 58 tokens). There, each step instead feeds a row its
current token plus ``k`` drafted tokens in one forward (:meth:`FastModel.decode_tokens
<evolm.engine.fast.model.FastModel.decode_tokens>`) and keeps the longest prefix of drafts that
greedy decoding would have chosen, plus the token after it: 1 to ``k + 1`` tokens a step, the
same tokens as plain greedy decoding (each kept token is the argmax after exactly the tokens
before it).

Drafts come from the row itself (:class:`NgramDrafter`, prompt lookup decoding): the latest
earlier occurrence of the row's last ``n`` tokens (``n`` = 3, 2, 1) and the tokens that followed
it. Loops, repeated formats and a search that rewrites its candidates repeat themselves.

The :class:`Speculator` runs eagerly (no CUDA graph: its shapes change every step) and syncs
once a step (the kept tokens extend the drafter's history on the host).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from evolm.engine.fast.lora import FastLora
from evolm.engine.fast.model import FastModel
from evolm.engine.fast.runner import Rows
from evolm.engine.fast.workspace import Workspace

MAX_NGRAM = 3


@dataclass
class History:
    """One row's tokens (prompt and completion, the current token last) and, for each n-gram
    that ends before the last token, where the tokens after its latest occurrence start."""

    tokens: list[int]
    after: dict[tuple[int, ...], int] = field(default_factory=dict)
    indexed: int = 0  # n-grams ending before this index are in ``after``

    def extend(self, new: list[int]) -> None:
        self.tokens += new
        toks = self.tokens
        for end in range(self.indexed, len(toks) - 1):  # never the last token's own n-grams
            for n in range(1, MAX_NGRAM + 1):
                if end - n + 1 >= 0:
                    self.after[tuple(toks[end - n + 1 : end + 1])] = end + 1
        self.indexed = max(self.indexed, len(toks) - 1)

    def draft(self, k: int) -> list[int]:
        """``k`` tokens: what followed the latest earlier occurrence of the longest suffix
        found (padded with its last token), else the last token repeated."""
        toks = self.tokens
        for n in range(min(MAX_NGRAM, len(toks)), 0, -1):
            at = self.after.get(tuple(toks[-n:]))
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
    drafted: int = 0
    kept: int = 0

    def timings(self) -> dict[str, float]:
        if not self.steps:
            return {}
        return {
            "spec_steps": float(self.steps),
            "spec_drafted": float(self.drafted),
            "spec_kept": float(self.kept),  # tokens a verify step produced, the bonus included
        }


class Speculator:
    """Verify steps over a :class:`Workspace`'s active slots (see the module docstring).

    Args:
        model: the fast forward.
        k: tokens drafted per row and step.
    """

    def __init__(self, model: FastModel, k: int) -> None:
        self.model, self.k = model, k
        self.drafter = NgramDrafter()
        self.stats = SpecStats()

    def _histories(self, ws: Workspace, slots: list[int], rows: Rows) -> None:
        """Start the history of each slot new to the tail: its prompt and its tokens so far
        (the current token, not yet in the cache, last)."""
        new = [s for s in slots if s not in self.drafter]
        if not new:
            return
        idx = torch.tensor(new, dtype=torch.long, device=ws.device)
        row_of, gen_of = ws.row[idx].tolist(), ws.gen[idx].tolist()
        for slot, row, gen in zip(new, row_of, gen_of, strict=True):
            prompt = rows.ids[row][rows.mask[row]].tolist()
            done = rows.out[row * rows.widest : row * rows.widest + gen].tolist()
            self.drafter.start(slot, prompt + done)

    def step(self, ws: Workspace, slots: list[int], lora: FastLora | None, rows: Rows) -> None:
        """One verify step of the live ``slots`` (greedy rows, no forced tokens): each row's
        kept tokens into ``rows.out``, its state advanced as that many plain steps would."""
        model, dev = self.model, ws.device
        self._histories(ws, slots, rows)
        sel = torch.tensor(slots, dtype=torch.long, device=dev)
        gen, budget, pos, lo = ws.gen[sel], ws.budget[sel], ws.lens[sel], ws.start[sel]
        room = int((budget - gen).min())  # tokens each row may still add: drafts never pass it
        k = max(0, min(self.k, room - 1))
        drafts = [self.drafter.draft(s, k) for s in slots] if k else [[] for _ in slots]
        tokens = torch.cat(
            [ws.tok[sel][:, None], torch.tensor(drafts, dtype=torch.long, device=dev)], 1
        )
        width = k + 1
        offsets = torch.arange(width, device=dev)
        rope = (pos - lo)[:, None] + offsets
        view = None if lora is None else lora.rows(ws.member[sel].repeat_interleave(width))
        h = model.decode_tokens(tokens, ws.cos[rope], ws.sin[rope], sel, pos, lo, ws.cache, view)
        chosen = torch.empty(h.shape[0], dtype=torch.long, device=dev)
        model.greedy(h, chosen, ws.scratch)
        chosen = chosen.view(len(slots), width)
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
        for slot, n, toks in zip(slots, counts, picked, strict=True):
            self.drafter.extend(slot, toks[:n])
        self.stats.steps += 1
        self.stats.drafted += k * len(slots)
        self.stats.kept += sum(counts)
