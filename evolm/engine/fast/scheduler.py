"""Continuous batching: which rows run when. A scheduling change goes in this file.

The :class:`Scheduler` owns the slots of a :class:`~.workspace.Workspace` (sized by the memory
planner, :mod:`.plan`) and drives the :class:`~.runner.ModelRunner`, which runs one step at a
time:

- admission: queue the rows (largest budget first); while rows wait and enough slots are free
  (a sixteenth of them, or nothing runs), prefill a batch of waiting rows into free slots
  (chunked by a token budget). Prefill gives each row its first token;
- decode ``check_every`` steps over the active slots: the batch is ``sel[:B]`` (batch row ->
  slot), ``B`` the smallest bucket >= active rows (padding rows point at the scratch slot);
  finished rows stop advancing;
- refill: sync once per ``check_every`` steps; finished rows free their slots;
- with adapters, prefills and decode batches keep their rows sorted by member, so the fused
  kernels' row tiles mostly hold one member and read its second factors once.

Its caps (``max_rows``: ``server.max_batch_rows``; ``utilization``:
``server.gpu_memory_utilization``; the KV cache's dtype) are fixed at construction. On CUDA each
``(bucket, adapters, greedy)`` step is captured once as a CUDA graph (the buckets are
``S/16 .. S`` in sixteenths and powers of two below), so a shrinking batch stops paying for idle
slots. On CPUs the same loop runs eagerly. Greedy tokens equal the HF path's.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from evolm.engine.fast.cudagraph import PhaseTimer
from evolm.engine.fast.lora import FastLora
from evolm.engine.fast.model import FastModel
from evolm.engine.fast.plan import (
    Shape,
    SlotPlan,
    device_memory,
    host_memory,
    plan_slots,
    prefill_tokens,
    total_memory,
)
from evolm.engine.fast.prefix import Prompts, plan_shares
from evolm.engine.fast.runner import Forced, ModelRunner, Rows
from evolm.engine.fast.speculate import Speculator
from evolm.engine.fast.workspace import CHECK_EVERY, Workspace, graph_key
from evolm.engine.stops import StopTable
from evolm.sampling import Sampling

log = logging.getLogger(__name__)


def slot_positions(positions: int) -> int:
    """The cache positions a workspace plans a slot for ``positions`` with: rounded up to a
    multiple of 16."""
    return -(-positions // 16) * 16


def lora_cols(lora: FastLora | None) -> int:
    """Rank columns of every member that the base GEMMs also produce (the widest group's)."""
    return 0 if lora is None else max((g.spare for g in lora.groups.values()), default=0)


TAIL_SHARE = 0.1
"""A decode step is in the tail when the queue is empty and fewer than this share of the slots
hold a running row: the steps that serve a few long rows (``time/engine_tail_s``)."""


@dataclass
class RunStats:
    """What one :meth:`Scheduler.run` counts, kept out of its loop: decode steps and prefills,
    the rows each decode step carried (``busy``) against its bucket (``padded``), each prefill's
    time span, and where the tail began."""

    timer: PhaseTimer
    slots: int
    steps: int = 0
    prefills: int = 0
    busy: int = 0
    padded: int = 0
    tail_steps: int = 0
    positions: int = 0  # prompt positions prefilled (left padding included)
    copied: int = 0  # of them, copied from a donor's shared prefix (server.share_prefix)
    spans: list[tuple[object, object]] = field(default_factory=list)
    tail_start: object | None = None

    def prefilled(self, begin: object) -> None:
        self.spans.append((begin, self.timer.now()))
        self.prefills += 1

    def decoding(self, steps: int, active: int, batch: int, queued: bool) -> None:
        """``steps`` decode steps of ``active`` running rows in a bucket of ``batch``."""
        tail = not queued and active < TAIL_SHARE * self.slots
        if tail and self.tail_start is None:
            self.tail_start = self.timer.now()
        self.steps += steps
        self.tail_steps += steps if tail else 0
        self.busy += active * steps
        self.padded += batch * steps

    def timings(self) -> dict[str, float]:
        """The phases (``generate_s``) and counters, as ``LocalEngine.last_timings`` reports
        them (``time/engine_<key>``)."""
        self.timer.mark("generate_s")
        end = self.timer.marks[-1][1]
        out = self.timer.done()
        tail_s = 0.0 if self.tail_start is None else self.timer.between(self.tail_start, end)
        return out | {
            "steps": float(self.steps),
            "prefills": float(self.prefills),
            "prefill_s": sum(self.timer.between(a, b) for a, b in self.spans),
            "slots": float(self.slots),
            # per decode step: rows in the batch (counted at each sync: rows that finished
            # since then count until they are retired), and the bucket's idle share beyond them
            "rows_per_step": self.busy / max(1, self.steps),
            "padding": 1 - self.busy / max(1, self.padded),
            "tail_s": tail_s,  # the steps with < TAIL_SHARE of the slots busy, queue empty
            "tail_steps": float(self.tail_steps),
            # the share of the prompt positions whose K/V a shared prefix gave (.prefix)
            "prefix_copied": self.copied / max(1, self.positions),
        }


class Scheduler:
    """Continuous batching over a :class:`FastModel` (see the module docstring).

    Args:
        model: the fast forward.
        max_rows: cap on concurrent rows (None: as many as fit).
        utilization: share of the device's memory the engine may fill.
        kv_dtype: the KV cache's dtype (None: the model's; ``torch.float8_e4m3fn``: half the
            bytes of bf16, so twice the slots and half the attention reads, at fp8 precision).
        name: the model's name in the planner's error.
        graphs: capture decode steps as CUDA graphs (None: on CUDA devices).
        prefill_tokens: tokens per prefill chunk (None: from a memory budget).
        check_every: decode steps between host syncs (finished rows are retired then).
        speculate: tokens drafted per row in the tail's verify steps (0: off; greedy rows only,
            the same tokens: :mod:`.speculate`).
        speculate_rows: the tail, where verify steps replace decode steps: the queue empty
            and at most this many rows running (None: under ``TAIL_SHARE`` of the slots), in a
            bucket whose ``k + 1`` verify rows a row fit the slots (``check_every`` verify
            steps between host syncs, as decode steps).
        share_prefix: a member's rows in one prefill batch that begin with the same tokens
            compute their K/V once (:mod:`.prefix`).
    """

    def __init__(
        self,
        model: FastModel,
        max_rows: int | None = None,
        utilization: float = 0.9,
        kv_dtype: torch.dtype | None = None,
        name: str = "the model",
        graphs: bool | None = None,
        prefill_tokens: int | None = None,
        check_every: int = CHECK_EVERY,
        speculate: int = 0,
        speculate_rows: int | None = None,
        share_prefix: bool = False,
    ) -> None:
        self.model, self.runner = model, ModelRunner(model, graphs)
        self.share_prefix = share_prefix
        self.speculate, self.speculate_rows = speculate, speculate_rows
        self.device = model.embed.device
        self.max_rows, self.utilization, self.kv_dtype = max_rows, utilization, kv_dtype
        self.name, self.prefill_tokens, self.check_every = name, prefill_tokens, check_every
        self.workspace: Workspace | None = None
        self.plan: SlotPlan | None = None
        self._greedy: bool | None = None  # the plan's sampling mode
        self._rows = self._cols = 0  # rows and LoRA columns the current plan was made for
        self._logged: set[str] = set()  # plans already logged at INFO
        self.last_timings: dict[str, float] = {}

    def reset(self) -> None:
        """Drop the workspace (its cache and graphs): the next call plans again."""
        self.workspace = self.plan = None

    # -- planning ------------------------------------------------------------------------
    def _chunk_tokens(self) -> int:
        """Tokens per prefill chunk (:func:`~.plan.prefill_tokens`)."""
        return prefill_tokens(self.shape(None), total_memory(self.device), self.prefill_tokens)

    def shape(self, lora: FastLora | None) -> Shape:
        m = self.model
        return Shape(
            layers=len(m.layers),
            kv_heads=m.kv_heads,
            head_dim=m.head_dim,
            hidden=m.hidden,
            inter=m.inter,
            q_out=m.q_out,
            vocab=m.lm_head.weight.shape[0],
            itemsize=m.embed.element_size(),
            weight_bytes=m.weight_bytes(),
            lora_cols=lora_cols(lora),
            name=self.name,
            dtype=str(m.embed.dtype).removeprefix("torch."),
            kv_itemsize=(self.kv_dtype or m.embed.dtype).itemsize,
        )

    def prepare(
        self,
        rows: int,
        positions: int,
        greedy: bool,
        lora: FastLora | None,
        history: bool = False,
    ) -> Workspace:
        """Plan the slots and allocate them, or reuse the workspace while it fits: as many
        slots and positions or more, the same sampling mode and weights, and a token history
        if ``history`` (speculative decoding) asks for one. A run's evaluations, fewer rows
        than its generations, then keep the generations' workspace and graphs."""
        positions = slot_positions(positions)
        ws = self.workspace
        if (
            ws is not None
            and ws.key == graph_key(self.model)
            and self._greedy == greedy
            and (ws.hist is not None or not history)  # no history: no verify steps on it
        ):
            every_row = ws.slots >= rows and ws.positions >= positions
            # fewer slots than its rows: memory or max_batch_rows capped it, as they would again
            # (for no wider LoRA activations than it was planned with)
            cols = lora_cols(lora)
            capped = ws.slots < self._rows and ws.positions == positions and cols <= self._cols
            if every_row or capped:
                return ws
        # free the old cache before measuring: no reference may outlive the reset (this frame's
        # ``ws`` kept a whole KV cache alive, and a larger eval plan found no memory left)
        ws = None
        self.reset()
        if self.device.type == "cuda":  # the old cache's blocks back to the device, measured free
            torch.cuda.empty_cache()
        plan = self._plan(rows, positions, greedy, lora, history)
        try:
            ws = Workspace(self.model, plan.slots, positions, self.kv_dtype, history)
        except torch.OutOfMemoryError as e:  # the plan's arithmetic was off: say so, with numbers
            raise RuntimeError(f"out of memory allocating {plan.describe()}: {e}") from e
        self.workspace, self.plan, self._greedy = ws, plan, greedy
        self._rows, self._cols = rows, lora_cols(lora)
        text = plan.describe()  # each plan once at INFO (eval and train alternate plans)
        log.log(
            logging.DEBUG if text in self._logged else logging.INFO, "continuous batching: %s", text
        )
        self._logged.add(text)
        return ws

    def _plan(
        self, rows: int, positions: int, greedy: bool, lora: FastLora | None, history: bool
    ) -> SlotPlan:
        """:func:`~.plan.plan_slots` for these rows with the memory free now (raises its
        ConfigError when they cannot decode)."""
        return plan_slots(
            self.shape(lora),
            rows,
            positions,
            greedy,
            self._chunk_tokens(),
            self.utilization,
            self.max_rows,
            device_memory(self.device),
            None if self.device.type == "cuda" else host_memory(),
            history=history,
        )

    def check(self, rows: int, length: int, widest: int, greedy: bool) -> None:
        """Raise the ConfigError that :meth:`run` of ``rows`` rows (prompts of ``length``
        tokens, budgets up to ``widest``) would raise for memory, without allocating: a run
        checks its generations' calls before its first eval, whose fewer rows would fit (e.g. a
        fixed ``server.max_batch_rows`` too large for the memory left). It measures the memory
        before the population's adapters are on the device and leaves out their rank columns
        (a large population's: GBs), so it is optimistic: what passes here may still fail at
        the generation, never the other way. Nothing while a workspace is held: its memory
        would count against the rows."""
        if self.workspace is not None:
            return
        drafts = self._drafts(greedy, None)
        self._plan(rows, slot_positions(length + widest), greedy, None, drafts > 0)

    def _drafts(self, greedy: bool, forced: Forced | None) -> int:
        """Tokens a row drafts in the tail's verify steps of a call (0: no speculation)."""
        return self.speculate if greedy and forced is None else 0

    # -- generation ----------------------------------------------------------------------
    @torch.inference_mode()
    def run(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        member: Tensor | None,
        lora: FastLora | None,
        budgets: Sequence[int],
        sampling: Sampling,
        eos_ids: Sequence[int],
        pad_id: int,
        generator: torch.Generator | None = None,
        stops: StopTable | None = None,
        forced: Forced | None = None,
        retired: Callable[[list[int], Tensor], None] | None = None,
    ) -> Tensor:
        """New tokens ``[rows, max(budgets)]`` for left-padded rows ``input_ids [rows, L]``;
        row ``i`` is member ``member[i]`` of ``lora`` (None: the base model) and stops after
        ``budgets[i]`` tokens, an EOS or the token that completes a stop string of ``stops``
        (then ``pad_id``). ``forced``: tokens fed instead of chosen (:meth:`forced_logits`).
        ``retired(rows, tokens)``: called as rows finish, while the others still decode, with
        their indices and the returned tensor's view (their rows of it are final then)."""
        timer = PhaseTimer(self.device)
        rows, length = input_ids.shape
        if len(budgets) != rows or min(budgets) < 1:
            raise ValueError("one budget >= 1 per row")
        greedy = sampling.temperature == 0
        widest = max(budgets)
        drafts = self._drafts(greedy, forced)
        # no positions for drafts past the widest budget: a verify step feeds those at its
        # slot's last position (never kept), so speculation costs no cache positions
        # (:mod:`.speculate`)
        ws = self.prepare(rows, length + widest, greedy, lora, history=drafts > 0)
        dev, runner = self.device, self.runner
        members = (
            torch.zeros(rows, dtype=torch.long, device=dev) if member is None else member.to(dev)
        )
        batch_rows = Rows(
            ids=input_ids.to(dev),
            mask=attention_mask.to(dev).bool(),
            members=members,
            budgets=torch.tensor(list(budgets), dtype=torch.long, device=dev),
            sampling=sampling,
            eos=torch.tensor(list(eos_ids), dtype=torch.long, device=dev),
            out=torch.full((rows * widest + 1,), pad_id, dtype=torch.long, device=dev),
            widest=widest,
            generator=generator,
            stops=stops,
            forced=forced,
        )
        chunk = max(1, self._chunk_tokens() // length)
        order = sorted(range(rows), key=lambda r: -budgets[r])
        queue, free = deque(order), list(range(ws.slots - 1, -1, -1))
        active: list[int] = []
        member_of = members.tolist() if lora is not None else None  # sort by member
        prompts = Prompts(input_ids, attention_mask) if self.share_prefix else None
        slot_member, slot_row = [0] * ws.slots, [0] * ws.slots
        tokens = batch_rows.out[:-1].view(rows, widest)
        refill = max(1, ws.slots // 16)
        stats, batch = RunStats(timer, ws.slots), 0
        spec = None
        if drafts and ws.slots > 1:  # a row's k + 1 tokens fit one forward of the slots
            spec = Speculator(runner, ws, min(drafts, ws.slots - 1), batch_rows, eos_ids)
        tail_rows = self.speculate_rows
        if tail_rows is None:
            tail_rows = max(1, math.ceil(TAIL_SHARE * ws.slots) - 1)  # fewer than TAIL_SHARE
        while queue or active:
            if queue and (not active or len(free) >= refill):
                take = min(len(free), len(queue))
                chosen = [queue.popleft() for _ in range(take)]
                slots = [free.pop() for _ in range(take)]
                if member_of is not None:
                    chosen.sort(key=member_of.__getitem__)
                    for row, slot in zip(chosen, slots, strict=True):
                        slot_member[slot] = member_of[row]
                for row, slot in zip(chosen, slots, strict=True):
                    slot_row[slot] = row
                begin = timer.now()
                shares = None if prompts is None else plan_shares(prompts, chosen, member_of)
                stats.copied += runner.prefill(ws, batch_rows, chosen, slots, lora, chunk, shares)
                stats.positions += len(chosen) * length
                stats.prefilled(begin)
                active += slots
                if member_of is not None:
                    active.sort(key=slot_member.__getitem__)
                    # the bucket's padding rows (the scratch slot) join the last member's tile
                    ws.member[ws.slots] = slot_member[active[-1]]
                batch = ws.set_batch(active)
            if spec is not None and not queue and len(active) <= tail_rows and spec.fits(batch):
                stats.decoding(self.check_every, len(active), batch, False)
                for _ in range(self.check_every):
                    spec.step(batch, lora)
            else:
                stats.decoding(self.check_every, len(active), batch, bool(queue))
                for _ in range(self.check_every):
                    runner.step(ws, batch, lora, batch_rows)
            done = ws.done[ws.sel[: len(active)]].tolist()
            if any(done):
                finished = [s for s, d in zip(active, done, strict=True) if d]
                free += finished
                active = [s for s, d in zip(active, done, strict=True) if not d]
                batch = ws.set_batch(active) if active else 0
                if retired is not None:
                    retired([slot_row[s] for s in finished], tokens)
        self.last_timings = stats.timings() | ({} if spec is None else spec.stats.timings())
        return tokens

    def forced_logits(
        self, input_ids: Tensor, attention_mask: Tensor, lora: FastLora | None, forced: Tensor
    ) -> Tensor:
        """Logits ``[rows, T + 1, vocab]`` after the prompt and after each of the ``T`` tokens
        of ``forced [rows, T]`` fed through the decode step (checks against a reference): one
        :meth:`run` that feeds the tokens instead of choosing them. Rows are member-major:
        ``lora.members`` equal groups (None: the base model)."""
        rows, steps = input_ids.shape[0], forced.shape[1]
        member = None if lora is None else torch.arange(rows) // (rows // lora.members)
        teacher = Forced(forced.to(self.device))
        sampling = Sampling(temperature=1.0, max_new_tokens=steps + 1)  # logits, no greedy block
        budgets = [steps + 1] * rows
        self.run(
            input_ids, attention_mask, member, lora, budgets, sampling, [], 0, None, None, teacher
        )
        return teacher.logits()
