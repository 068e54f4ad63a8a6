"""One step of the fast path: a prefill of chosen rows into slots, or one decode step over the
current batch of slots (captured once per ``(bucket, adapters, greedy)`` as a CUDA graph on
GPUs, eager on CPUs). It runs what the scheduler (:mod:`.scheduler`) decides; it never picks
rows. Sampling runs outside the graph (the caller's ``torch.Generator``); greedy decoding's LM
head and argmax run inside it, a block of rows at a time, so no ``[rows, vocab]`` logits are
held. Speculative decoding's verify step (:mod:`.speculate`) runs its forward
(:meth:`ModelRunner.verify`) inside its own graph (:meth:`ModelRunner.graphed`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from evolm.engine.fast.cudagraph import capture
from evolm.engine.fast.lora import FastLora, FastLoraRows
from evolm.engine.fast.model import FastModel, prefill_mask
from evolm.engine.fast.prefix import Shares
from evolm.engine.fast.workspace import Workspace
from evolm.engine.sampler import next_token
from evolm.engine.stops import StopTable
from evolm.sampling import Sampling


def member_runs(members: list[int], length: int) -> tuple[tuple[int, int, int], ...]:
    """``(member, first token, end token)`` of each run of equal members in rows of ``length``
    tokens (rows sorted by member: one run per member)."""
    runs: list[tuple[int, int, int]] = []
    for i, m in enumerate(members):
        if runs and runs[-1][0] == m:
            runs[-1] = (m, runs[-1][1], (i + 1) * length)
        else:
            runs.append((m, i * length, (i + 1) * length))
    return tuple(runs)


class Forced:
    """Teacher forcing (checks against a reference): the runner feeds row ``i`` the tokens
    ``tokens[i]`` instead of choosing them, and keeps the logits it saw before each of them and
    after the last (:meth:`logits`: ``[rows, T + 1, vocab]``)."""

    def __init__(self, tokens: Tensor) -> None:
        rows, self.steps = tokens.shape
        self.tokens = torch.cat([tokens, tokens.new_zeros(rows, 1)], dim=1)  # then any token
        self._seen: Tensor | None = None  # one dump row at the end (finished rows, scratch)

    def choose(self, logits: Tensor, row: Tensor, gen: Tensor, live: Tensor | None) -> Tensor:
        """The tokens fed to rows ``row`` after their ``gen`` tokens; ``logits`` kept
        (``live`` False: a finished row's, dropped)."""
        rows = self.tokens.shape[0]
        if self._seen is None:
            shape = (rows + 1, self.steps + 1, logits.shape[-1])
            self._seen = logits.new_empty(shape)
        at = row if live is None else torch.where(live, row, rows)
        self._seen[at, gen.clamp(max=self.steps)] = logits
        return self.tokens[row.clamp(max=rows - 1), gen.clamp(max=self.steps)]

    def logits(self) -> Tensor:
        assert self._seen is not None, "nothing ran"
        return self._seen[:-1]


@dataclass(frozen=True)
class Rows:
    """The rows of one generation, as the scheduler hands them to the runner: left-padded
    ``ids`` / ``mask`` on the device, each row's member and token budget, the decoding settings,
    ``out``: ``widest`` new tokens per row, row-major, plus one dump cell at the end,
    ``stops``: the stop strings' automaton (None: no stop strings), and ``forced``: tokens fed
    instead of chosen (None: sampled or greedy)."""

    ids: Tensor
    mask: Tensor
    members: Tensor
    budgets: Tensor
    sampling: Sampling
    eos: Tensor
    out: Tensor
    widest: int
    generator: torch.Generator | None
    stops: StopTable | None = None
    forced: Forced | None = None

    def choose(self, logits: Tensor, row: Tensor, gen: Tensor, live: Tensor | None) -> Tensor:
        """The next tokens of rows ``row`` (``gen`` tokens generated; ``live``: still running)
        after ``logits``: drawn by the sampler, or the forced ones."""
        if self.forced is None:
            return next_token(logits, self.sampling, self.generator)
        return self.forced.choose(logits, row, gen, live)

    def emit(
        self, nxt: Tensor, take: Tensor, row: Tensor, index: Tensor, budget: Tensor, state: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Token ``nxt`` written as token ``index`` of rows ``row`` where ``take`` (elsewhere
        into the dump cell, unchanged); returns which of them it finished (an EOS, the row's
        ``budget`` reached or a stop string completed) and the stop automaton's ``state``
        advanced where taken."""
        out, widest = self.out, self.widest
        dump = out.shape[0] - 1
        at = torch.where(take, row * widest + index.clamp(max=widest - 1), dump)
        out[at] = torch.where(take, nxt, out[dump])
        return finishes(nxt, torch.isin(nxt, self.eos), take, index, budget, self.stops, state)


def finishes(
    nxt: Tensor,
    is_eos: Tensor,
    take: Tensor,
    index: Tensor,
    budget: Tensor,
    stops: StopTable | None,
    state: Tensor,
) -> tuple[Tensor, Tensor]:
    """Which of the tokens ``nxt`` (token ``index`` of their rows; ``is_eos``: which are EOS
    ids) end their row where ``take``: an EOS, the row's ``budget`` reached, or a stop string
    completed; and the stop automaton's ``state`` advanced where taken. The one finishing rule
    of plain steps (:meth:`Rows.emit`) and verify steps (:mod:`.speculate`)."""
    finished = is_eos | (index + 1 >= budget)
    if stops is not None:
        state = torch.where(take, stops.advance(state, nxt), state)
        finished = finished | (state == stops.done)
    return take & finished, state


class ModelRunner:
    """Runs prefill chunks and decode steps of a :class:`FastModel` on a :class:`Workspace`.

    Args:
        model: the fast forward.
        graphs: capture decode steps as CUDA graphs (None: on CUDA devices).
    """

    prefill_runs = True  # eager LoRA in prefill by member runs (False: per row, as the kernels)

    def __init__(self, model: FastModel, graphs: bool | None = None) -> None:
        self.model = model
        self.device = model.embed.device
        self.graphs = self.device.type == "cuda" if graphs is None else graphs

    def prefill_chunk(
        self,
        ws: Workspace,
        ids: Tensor,
        mask: Tensor,
        rows: Tensor,
        slots: Tensor,
        members: Tensor,
        lora: FastLora | None,
        past: int = 0,
    ) -> Tensor:
        """Prompts ``ids[rows]`` into ``slots`` (cache and slot state); their last-position
        logits ``[len(rows), vocab]``. ``past``: the slots already hold the K/V of the first
        ``past`` positions (:mod:`.prefix`); only the positions after them are computed."""
        length = ids.shape[1]
        mem, m = members[rows], mask[rows]
        positions = (m.long().cumsum(-1) - 1).clamp(min=0)[:, past:]
        cos, sin = ws.cos[positions], ws.sin[positions]
        pmask = None if not past and bool(m.all()) else prefill_mask(m, ws.dtype, past)
        view: FastLoraRows | None = None
        if lora is not None:  # rows sorted by member (the scheduler): eager LoRA takes one small
            # GEMM per member's run of tokens, the Triton kernels one Bt read per tile
            per_token = mem.repeat_interleave(length - past)
            runs = self.prefill_runs and self.model.ops.mode != "triton"
            runs_of = member_runs(mem.tolist(), length - past) if runs else None
            view = lora.rows(per_token) if runs_of is None else lora.runs(per_token, runs_of)
        logits = self.model.prefill(ids[rows, past:], cos, sin, pmask, ws.cache, slots, view, past)
        ws.lens[slots] = length
        ws.start[slots] = length - m.sum(-1)
        ws.member[slots] = mem
        ws.row[slots] = rows
        return logits

    def prefill(
        self,
        ws: Workspace,
        rows: Rows,
        chosen: list[int],
        slots: list[int],
        lora: FastLora | None,
        chunk: int,
        shares: Shares | None = None,
    ) -> int:
        """Prompts of rows ``chosen`` into ``slots``, ``chunk`` rows per forward; each row's
        first token (into ``rows.out``). ``shares``: rows that copy a donor's K/V of their
        shared prefix (:mod:`.prefix`): the others first, whole, then those. Returns the
        positions copied instead of computed."""
        levels = [list(range(len(chosen)))] if shares is None else shares.levels()
        copied = 0
        for level in levels:  # rows prefilled whole, then those that copy them, and so on
            for lo in range(0, len(level), chunk):
                part = level[lo : lo + chunk]
                r, s = self._ids([chosen[i] for i in part]), self._ids([slots[i] for i in part])
                past = 0 if shares is None else min(shares.end[i] for i in part)
                if shares is not None and past:
                    donors = self._ids([slots[shares.donor[i]] for i in part])
                    start = rows.ids.shape[1] - rows.mask[r].sum(-1)
                    self._copy_prefix(ws, donors, s, start, past, rows.ids.shape[1])
                logits = self.prefill_chunk(ws, rows.ids, rows.mask, r, s, rows.members, lora, past)
                self._first(ws, rows, r, s, logits)
                copied += past * len(part)
        return copied

    def _ids(self, values: list[int]) -> Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    @staticmethod
    def _copy_prefix(
        ws: Workspace, donors: Tensor, slots: Tensor, start: Tensor, past: int, width: int
    ) -> None:
        """Cache positions ``0..past-1`` of ``slots`` from their ``donors``' slots (prompts of
        ``width`` positions, left-padded), each shifted by the two rows' starts (a shorter
        prompt starts further right; a donor's slot holds its whole left-padded prompt, so the
        positions left of a row's start get finite padding K/V, masked)."""
        shift = ws.start[donors] - start
        at = (torch.arange(past, device=slots.device)[None] + shift[:, None]).clamp(0, width - 1)
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}  # copied as bits: fp8 has no gather
        for layer in (*ws.cache.k, *ws.cache.v):
            cache = layer.view(bits[layer.element_size()])
            src = cache[donors, :, :width]  # [rows, kv_heads, width, head_dim]
            index = at[:, None, :, None].expand(-1, src.shape[1], -1, src.shape[3])
            cache[slots, :, :past] = src.gather(2, index)

    @staticmethod
    def _first(ws: Workspace, rows: Rows, r: Tensor, s: Tensor, logits: Tensor) -> None:
        """Rows ``r``, prefilled into slots ``s``: their first tokens and slot state."""
        first = rows.choose(logits, r, torch.zeros_like(r), None)
        ws.budget[s] = rows.budgets[r]
        ws.tok[s] = first
        ws.gen[s] = 1
        rows.out[r * rows.widest] = first
        if ws.hist is not None:  # left-padded: positions below the slot's start are masked
            ws.hist[s, : rows.ids.shape[1]] = rows.ids[r]
        ws.done[s] = torch.isin(first, rows.eos) | (rows.budgets[r] <= 1)
        if rows.stops is not None:
            ws.stop[s] = rows.stops.table[0, first]
            ws.done[s] |= ws.stop[s] == rows.stops.done

    def forward(self, ws: Workspace, batch: int, lora: FastLora | None, greedy: bool) -> None:
        """The decode forward of the batch's slots at their current tokens: greedy's argmax in
        ``ws.next[:batch]``, else the logits in ``ws.logits[:batch]`` (a CUDA graph on GPUs).
        With a token history (:attr:`Workspace.hist`), each slot's token goes into it at the
        position it is fed at."""
        sel = ws.sel[:batch]

        def run() -> None:
            tok, pos = ws.tok[sel], ws.lens[sel]
            if ws.hist is not None:
                ws.hist[sel, pos] = tok
            x = self._decode(ws, tok, sel, pos, ws.start[sel], ws.member[sel], lora)
            if greedy:
                self.model.greedy(x, ws.next[:batch], ws.scratch)
            else:
                self.model.logits(x, out=ws.logits[:batch])

        self.graphed(ws, (batch, id(lora), greedy), lora, run)

    def verify(
        self,
        ws: Workspace,
        tokens: Tensor,
        sel: Tensor,
        at: Tensor,
        lo: Tensor,
        member: Tensor,
        lora: FastLora | None,
        out: Tensor,
    ) -> None:
        """Speculative decoding's verify forward (:mod:`.speculate`): greedy's choice after each
        of ``tokens [rows, width]`` into ``out [rows, width]``, row ``b``'s token ``j`` fed in
        cache row ``sel[b]`` at position ``at[b, j]`` (consecutive, but for those capped at the
        slot's last position: never falling; its prompt from ``lo[b]``, LoRA member
        ``member[b]``). The decode step's own path (fused K/V writes, the slot-attention
        kernel, per-row LoRA members) over ``rows x width`` *verify rows*: each layer writes
        every verify row's K/V before it reads any (one kernel each), so a row's later tokens
        see its earlier ones. No graph of its own: it runs inside the caller's (no host sync)."""
        width = tokens.shape[1]

        def each(t: Tensor) -> Tensor:  # a row's value for each of its verify rows: a copy (the
            # kernels index rows contiguously; an expanded view of one row would be stride 0)
            return t.repeat_interleave(width)

        flat = tokens.reshape(-1)
        x = self._decode(ws, flat, each(sel), at.reshape(-1), each(lo), each(member), lora, width)
        self.model.greedy(x, out.view(-1), ws.scratch)

    def _decode(
        self,
        ws: Workspace,
        tok: Tensor,
        slot: Tensor,
        pos: Tensor,
        lo: Tensor,
        member: Tensor,
        lora: FastLora | None,
        span: int = 1,
    ) -> Tensor:
        """:meth:`FastModel.decode_slots` of tokens ``tok`` in cache rows ``slot`` at
        positions ``pos`` (prompts from ``lo``), of LoRA ``member`` s: final-normed states
        (``span``: rows in runs of one slot's consecutive positions, verify rows, the last
        ones possibly capped at its last position)."""
        rope = pos - lo
        view = None if lora is None else lora.rows(member)
        return self.model.decode_slots(
            tok, ws.cos[rope], ws.sin[rope], slot, pos, lo, ws.cache, view, span
        )

    def graphed(
        self, ws: Workspace, key: tuple[object, ...], keep: object, run: Callable[[], None]
    ) -> None:
        """``run()``: eagerly, or as the CUDA graph captured once per ``key`` on GPUs (the entry
        keeps ``keep`` alive: the objects whose ids are in ``key``, so no id is reused). The
        capture's warm-up run is the first call's run (no replay after it): ``run`` may advance
        state (a verify step does), so it must run exactly once a call."""
        if not self.graphs:
            run()
            return
        if key not in ws.graphs:
            ws.graphs[key] = (capture(run, ws.pool), keep)
            return
        ws.graphs[key][0].replay()  # type: ignore[attr-defined]

    def step(self, ws: Workspace, batch: int, lora: FastLora | None, rows: Rows) -> None:
        """One decode step of the batch's slots: each live slot's next token into
        ``rows.out``; finished slots (EOS, budget or stop string) stop advancing."""
        greedy = rows.sampling.temperature == 0
        sel = ws.sel[:batch]
        self.forward(ws, batch, lora, greedy)
        live = ~ws.done[sel]
        gen, row = ws.gen[sel], ws.row[sel]
        nxt = ws.next[:batch] if greedy else rows.choose(ws.logits[:batch], row, gen, live)
        finished, state = rows.emit(nxt, live, row, gen, ws.budget[sel], ws.stop[sel])
        if rows.stops is not None:  # finished rows (and the scratch slot) keep their state
            ws.stop[sel] = state
        ws.tok[sel] = nxt
        step = live.long()
        ws.gen[sel] = gen + step
        ws.lens[sel] = ws.lens[sel] + step
        ws.done[sel] = ~live | finished
