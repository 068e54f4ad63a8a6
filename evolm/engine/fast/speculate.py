"""Exact speculative decoding of greedy rows in the tail of a generation (``server.speculate``).

A generation's last decode steps serve a few long rows: the batch is tiny, the GPU waits on
latency, and those steps took most of the decode time on the real workload (issue 37: ~1,056
steps a generation where rows average 58 tokens). There, each step instead feeds a row its
current token plus ``k`` drafted tokens in one forward and keeps the longest prefix of drafts
that greedy decoding would have chosen, plus the token after it: 1 to ``k + 1`` tokens a step,
the same tokens as plain greedy decoding (each kept token is the argmax after exactly the tokens
before it). Every slot has ``k`` cache positions past the widest budget, so every row drafts
``k`` tokens up to its last one (those past its budget are never kept).

Drafts come from the row itself (:func:`ngram_drafts`, prompt lookup decoding): what followed
the latest earlier occurrence of the row's last ``n`` tokens (``n`` = 3, 2, 1, the longest
found). Loops, repeated formats and a search that rewrites its candidates repeat themselves.
The lookup runs on the device over every row's prompt and tokens at once, a few elementwise
kernels a step: no history on the host, no per-row Python, no sync (a first version kept each
row's n-grams in Python dicts: drafting and extending 400 rows took ~10 ms of host time a step
on the developers' CPU, more than the verify forward).

The verify forward is the decode step's own (:meth:`ModelRunner.verify_forward
<evolm.engine.fast.runner.ModelRunner.verify_forward>`): a row's ``k + 1`` tokens are ``k + 1``
rows of the step, each writing its K/V and attending as a decode step would, captured as CUDA
graphs per bucket. The rest of a verify step runs eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from evolm.engine.fast.lora import FastLora
from evolm.engine.fast.runner import ModelRunner, Rows
from evolm.engine.fast.workspace import Workspace, bucket

MAX_NGRAM = 3


def ngram_drafts(seq: Tensor, valid: Tensor, last: Tensor, k: int) -> Tensor:
    """``k`` drafted tokens per row ``[rows, k]``: of ``seq [rows, T]`` (``valid``: which are
    the row's tokens, one contiguous run; ``last [rows]``: the index of its last one), what
    followed the latest occurrence of its last ``n`` tokens that ends before its last token,
    for the longest ``n`` <= :data:`MAX_NGRAM` found; padded with the row's last token when the
    continuation reaches it; no occurrence: the last token repeated."""
    rows, width = seq.shape
    index = torch.arange(width, device=seq.device)
    match = valid & (index < last[:, None])  # where an earlier n-gram may end
    after = last.clone()  # no occurrence: continue from the last token
    for n in range(1, MAX_NGRAM + 1):
        at = (last - (n - 1)).clamp(min=0)[:, None]  # the suffix's n-th token from its end
        same = (seq == seq.gather(1, at)) & valid & valid.gather(1, at)
        if n > 1:  # token e - (n - 1) of an n-gram ending at e
            same = torch.cat([same.new_zeros(rows, n - 1), same[:, : width - n + 1]], 1)
        match = match & same
        end = torch.where(match, index, -1).amax(1)
        after = torch.where(end >= 0, end + 1, after)  # a longer n-gram overrides
    cont = torch.minimum(after[:, None] + torch.arange(k, device=seq.device), last[:, None])
    return seq.gather(1, cont)


@dataclass
class SpecStats:
    """Verify steps, their rows, and the tokens they drafted and kept (``time/engine_spec_*``;
    the kept count stays on the device until read)."""

    steps: int = 0
    rows: int = 0
    drafted: int = 0
    kept: Tensor | int = 0

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
        k: tokens drafted per row and step, at most the workspace's slots - 1 (a row's
            ``k + 1`` tokens fit one forward; the scheduler plans ``k`` cache positions past
            the widest budget, and tokens past a row's budget are never kept).
    """

    def __init__(self, runner: ModelRunner, k: int) -> None:
        self.runner, self.k = runner, k
        self.stats = SpecStats()

    @staticmethod
    def _drafts(ws: Workspace, sel: Tensor, gen: Tensor, rows: Rows, k: int) -> Tensor:
        """:func:`ngram_drafts` of slots ``sel``: each row's prompt and its ``gen`` tokens so
        far (the current token, not yet in the cache, last)."""
        row = ws.row[sel]
        ids, mask = rows.ids[row], rows.mask[row]
        done = rows.out[:-1].view(-1, rows.widest)[row]
        written = torch.arange(rows.widest, device=ws.device) < gen[:, None]
        seq, valid = torch.cat([ids, done], 1), torch.cat([mask, written], 1)
        return ngram_drafts(seq, valid, ids.shape[1] + gen - 1, k)

    def step(self, ws: Workspace, slots: list[int], lora: FastLora | None, rows: Rows) -> None:
        """One verify step of the live ``slots`` (greedy rows, no forced tokens): each row's
        kept tokens into ``rows.out``, its state advanced as that many plain steps would."""
        dev = ws.device
        sel = torch.tensor(slots, dtype=torch.long, device=dev)
        gen, budget, pos, lo = ws.gen[sel], ws.budget[sel], ws.lens[sel], ws.start[sel]
        k = self.k
        width = k + 1
        tokens = torch.cat([ws.tok[sel][:, None], self._drafts(ws, sel, gen, rows, k)], 1)
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
        self.stats.steps += 1
        self.stats.rows += len(slots)
        self.stats.drafted += k * len(slots)
        self.stats.kept = kept.sum() + self.stats.kept

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
