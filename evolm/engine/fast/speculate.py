"""Exact speculative decoding of greedy rows in the tail of a generation (``server.speculate``).

A generation's last decode steps serve a few long rows: the batch is tiny, the GPU waits on
latency, and those steps took most of the decode time on the real workload (issue 37: ~1,056
steps a generation where rows average 58 tokens). There, each step instead feeds a row its
current token plus ``k`` drafted tokens in one forward and keeps the longest prefix of drafts
that greedy decoding would have chosen, plus the token after it: 1 to ``k + 1`` tokens a step,
the same tokens as plain greedy decoding (each kept token is the argmax after exactly the tokens
before it). Every row drafts ``k`` tokens up to its last one; a draft that would be fed past
its slot's last cache position is fed *at* it. No kept token needs that position (a row's last
token is never fed), and only queries at it read it, whose choices lie past the budget and are
never kept; so the cache needs no room past the widest budget, and speculation costs no cache
positions (W-real 1.5B fixed, session 36: 4 positions of room, rounded to 16, made a slot 1.3%
larger, about half of the 48 slots of 2,046 it had fewer, and a fourth wave).

Drafts come from the row itself (:func:`ngram_drafts`, prompt lookup decoding): what followed
the latest earlier occurrence of the row's last ``n`` tokens (``n`` = 3, 2, 1, the longest
found). Loops, repeated formats and a search that rewrites its candidates repeat themselves.
The lookup runs on the device over every row's tokens at once, a few elementwise kernels a
step: no history on the host, no per-row Python, no sync (a first version kept each row's
n-grams in Python dicts: drafting and extending 400 rows took ~10 ms of host time a step on
the developers' CPU, more than the verify forward). A row's tokens are its slot's token history
(:attr:`Workspace.hist <evolm.engine.fast.workspace.Workspace.hist>`, aligned with its cache:
the prompt written by the prefill, each token at the position it is fed at).

A verify step is ONE CUDA graph per ``(bucket, k, adapters, stop strings, EOS ids)`` (eager on
CPUs: the same closure), reading and writing only the workspace's buffers: the batch's state,
the drafts, the verify forward (:meth:`ModelRunner.verify
<evolm.engine.fast.runner.ModelRunner.verify>`: a row's ``k + 1`` tokens are ``k + 1`` rows of
the decode step's own path), which tokens each row keeps (EOS, budget, stop strings: as plain
steps would take them), the slots' new state and where each kept token goes in the caller's
output. After the replay one eager scatter writes the kept tokens into it. A step's verify
rows fit one forward of the planned slots (bucket x ``(k + 1)`` <= slots); a batch too wide
for that takes plain decode steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from evolm.engine.fast.lora import FastLora
from evolm.engine.fast.runner import ModelRunner, Rows, finishes
from evolm.engine.fast.workspace import SpecBuffers, Workspace
from evolm.engine.stops import StopTable

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
    """Verify steps, their running rows, and the tokens they drafted and kept
    (``time/engine_spec_*``; the rows and kept counts stay on the device until read)."""

    k: int
    rows: Tensor
    kept: Tensor
    steps: int = 0

    def timings(self) -> dict[str, float]:
        if not self.steps:
            return {}
        rows = float(self.rows)
        return {
            "spec_steps": float(self.steps),
            "spec_rows": rows,  # rows of all verify steps
            "spec_drafted": self.k * rows,
            "spec_kept": float(self.kept),  # tokens a verify step produced, the bonus included
        }


class Speculator:
    """Verify steps of one generation over a :class:`Workspace`'s batch (see the module
    docstring).

    Args:
        runner: runs the steps (:meth:`ModelRunner.graphed`) and their forward
            (:meth:`ModelRunner.verify`).
        ws: the workspace, with a token history (:attr:`Workspace.hist`).
        k: tokens drafted per row and step, at most the workspace's slots - 1 (a row's
            ``k + 1`` tokens fit one forward; tokens past a row's budget are never kept, and
            those past its slot's last position are fed at it).
        rows: the generation's rows (greedy, no forced tokens): the kept tokens go into
            ``rows.out``, and its stop strings end rows.
        eos: the EOS ids (those of ``rows.eos``).
    """

    def __init__(
        self, runner: ModelRunner, ws: Workspace, k: int, rows: Rows, eos: Sequence[int]
    ) -> None:
        assert ws.hist is not None, "speculative decoding drafts from the token history"
        self.runner, self.ws, self.k, self.rows = runner, ws, k, rows
        self.eos = tuple(eos)
        self.buf = ws.speculation(k + 1)
        shape = torch.tensor([rows.widest, rows.out.shape[0] - 1], dtype=torch.long)
        self.buf.shape.copy_(shape)  # the graphs read this generation's out layout from here
        self.buf.kept.zero_()
        self.buf.rows.zero_()
        self.stats = SpecStats(k, rows=self.buf.rows, kept=self.buf.kept)

    def fits(self, batch: int) -> bool:
        """Whether a batch bucket's verify rows fit one forward of the planned slots."""
        return batch <= self.buf.chosen.shape[0]

    def step(self, batch: int, lora: FastLora | None) -> None:
        """One verify step of the batch's ``batch`` slots (a bucket that :meth:`fits`): each
        running row's kept tokens into ``rows.out``, its state advanced as that many plain
        steps would."""
        stops = self.rows.stops
        key = ("spec", batch, self.k, id(lora), id(stops), self.eos)
        run = verify_step(self.runner, self.ws, self.buf, batch, self.k, lora, stops, self.eos)
        self.runner.graphed(self.ws, key, (lora, stops), run)
        at, chosen = self.buf.at[:batch], self.buf.chosen[:batch]
        self.rows.out[at.reshape(-1)] = chosen.reshape(-1)  # the one write outside the graph
        self.stats.steps += 1


def verify_step(
    runner: ModelRunner,
    ws: Workspace,
    buf: SpecBuffers,
    batch: int,
    k: int,
    lora: FastLora | None,
    stops: StopTable | None,
    eos: Sequence[int],
) -> Callable[[], None]:
    """The closure of one verify step of slots ``ws.sel[:batch]`` (what :meth:`Speculator.step`
    captures): it reads and writes only the workspace's tensors, ``lora``'s and ``stops``'
    (kept alive with its graph), and branches on nothing but the arguments, so the graph
    replays what an eager call runs. It leaves each row's greedy choices in ``buf.chosen`` and
    their places in the caller's ``out`` in ``buf.at`` (its dump cell where not kept)."""
    width, dev = k + 1, ws.device
    eos_ids = ws.ids(eos)  # kept by the workspace per tuple: the graph reads its address
    hist = ws.hist
    assert hist is not None

    def run() -> None:
        sel = ws.sel[:batch]
        tok, pos, lo, gen = ws.tok[sel], ws.lens[sel], ws.start[sel], ws.gen[sel]
        hist[sel, pos] = tok  # the current token, fed at its position
        column = torch.arange(hist.shape[1], device=dev)
        # each fed token's position; past the slot's last one, at it (module doc)
        at = torch.minimum(pos[:, None] + torch.arange(width, device=dev), column[-1])
        valid = (column >= lo[:, None]) & (column <= pos[:, None])
        tokens = torch.cat([tok[:, None], ngram_drafts(hist[sel], valid, pos, k)], 1)
        chosen = buf.chosen[:batch]
        runner.verify(ws, tokens, sel, at, lo, ws.member[sel], lora, chosen)
        # drafts kept: the leading ones greedy chose; then the token greedy chose after them
        agree = (tokens[:, 1:] == chosen[:, :-1]).long().cumprod(1).sum(1)
        widest, dump = buf.shape[0], buf.shape[1]
        row, budget, state, done = ws.row[sel], ws.budget[sel], ws.stop[sel], ws.done[sel]
        is_eos = (chosen[:, :, None] == eos_ids).any(2)
        live, kept = ~done, torch.zeros_like(gen)
        buf.rows.add_(live.sum())
        for j in range(width):  # token j of each row, as plain step j would take it: a taken
            take = live & (agree >= j)  # token's row took tokens 0..j-1 too (its gen + j-th)
            index = gen + j
            into = row * widest + torch.minimum(index, widest - 1)
            buf.at[:batch, j] = torch.where(take, into, dump)
            finished, state = finishes(
                chosen[:, j], is_eos[:, j], take, index, budget, stops, state
            )
            kept += take.long()
            done = done | finished
            live = live & ~finished
        # the fed tokens by position: the kept ones right (drafts greedy agreed with), those
        # past them at or above the new length (overwritten as they are fed, masked till then)
        hist[sel[:, None], at] = tokens
        last = chosen.gather(1, (kept - 1).clamp(min=0)[:, None])[:, 0]
        ws.tok[sel] = torch.where(kept > 0, last, tok)
        ws.gen[sel], ws.lens[sel], ws.stop[sel], ws.done[sel] = gen + kept, pos + kept, state, done
        buf.kept.add_(kept.sum())

    return run
