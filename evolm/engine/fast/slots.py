"""Continuous batching on the fast forward: a fixed set of slots, refilled as rows finish.

Each slot holds one row's KV cache (``[layers, slots + 1, kv_heads, T, head_dim]``; the extra
slot is scratch for the padding rows of a batch bucket) and its state: cache length ``lens``
(the next write position), ``start`` (left padding of its prompt), ``member``, tokens generated
``gen``, its ``budget`` (the row's own max_new_tokens) and ``done`` (EOS or budget reached).

The scheduler (:meth:`SlotGenerator.generate`):

- queue the rows (largest budget first); while rows wait and enough slots are free (or nothing
  runs), prefill a batch of waiting rows into free slots (chunked by a token budget). Prefill
  gives each row its first token;
- decode ``check_every`` steps over the active slots: the batch is ``sel[:B]`` (batch row ->
  slot), ``B`` the smallest bucket >= active rows (padding rows point at the scratch slot).
  Every step gathers the slots' tokens, positions and members, runs
  :meth:`FastModel.decode_slots` (attention over each row's own ``[start, len]``, LoRA by each
  row's member), and scatters the next token back; finished rows stop advancing;
- sync once per ``check_every`` steps: finished rows free their slots.

On CUDA each ``(bucket, adapters, greedy)`` step is captured once as a CUDA graph (the buckets
are ``S/16 .. S`` in sixteenths and powers of two below), so a shrinking batch stops paying for
idle slots. On CPUs the same loop runs eagerly. Greedy tokens equal the one-batch path.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence

import torch
from torch import Tensor

from evolm.engine.fast.cudagraph import PhaseTimer, capture
from evolm.engine.fast.lora import FastLora, FastLoraRows
from evolm.engine.fast.model import FastModel, prefill_mask
from evolm.engine.fast.plan import GREEDY_ROWS, Shape, SlotPlan, device_memory, plan_slots
from evolm.engine.hf.generation import next_token
from evolm.sampling import Sampling

log = logging.getLogger(__name__)

MIN_PREFILL_BYTES = 256 * 2**20
PREFILL_SHARE = 0.04  # prefill transients <= this share of the device memory, or the minimum
BUCKETS = 16  # graphs per (adapters, greedy): eighths padded the fp8 cache's 4,074 slots 6.8%


def lora_cols(lora: FastLora | None) -> int:
    """Rank columns of every member that the base GEMMs also produce (the widest group's)."""
    return 0 if lora is None else max((g.spare for g in lora.groups.values()), default=0)


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


def buckets(slots: int) -> list[int]:
    """Batch sizes with a graph: sixteenths of ``slots`` and powers of two below them."""
    out = {max(1, -(-slots * k // BUCKETS)) for k in range(1, BUCKETS + 1)}
    p = 1
    while p < slots / BUCKETS:
        out.add(p)
        p *= 2
    return sorted(out)


class SlotWorkspace:
    """The static slot buffers (see the module docstring)."""

    def __init__(
        self, model: FastModel, slots: int, positions: int, kv_dtype: torch.dtype | None = None
    ) -> None:
        dev = model.embed.device
        self.slots, self.positions, self.device = slots, positions, dev
        self.cache = model.new_cache(slots + 1, positions, kv_dtype)
        self.cos, self.sin = model.rope_tables(positions)

        def z(dtype: torch.dtype = torch.long) -> Tensor:
            return torch.zeros(slots + 1, dtype=dtype, device=dev)

        self.lens, self.start, self.member = z(), z(), z()
        self.gen, self.budget, self.row = z(), z(), z()
        self.tok, self.done = z(), z(torch.bool)
        self.done[slots] = True  # the scratch slot never advances
        self.sel = torch.full((slots,), slots, dtype=torch.long, device=dev)
        self.next = torch.zeros(slots, dtype=torch.long, device=dev)
        self.vocab, self.dtype = model.lm_head.weight.shape[0], model.embed.dtype
        self.greedy_rows = min(slots, GREEDY_ROWS)
        self._scratch: Tensor | None = None
        self._logits: Tensor | None = None
        self.graphs: dict[tuple[int, int, bool], tuple[torch.cuda.CUDAGraph, object]] = {}
        self.pool = torch.cuda.graph_pool_handle() if dev.type == "cuda" else None
        self.key = (model.lm_head.weight.data_ptr(), model.weights_version)

    @property
    def scratch(self) -> Tensor:
        if self._scratch is None:
            shape = (self.greedy_rows, self.vocab)
            self._scratch = torch.empty(shape, dtype=self.dtype, device=self.device)
        return self._scratch

    @property
    def logits(self) -> Tensor:
        if self._logits is None:
            shape = (self.slots, self.vocab)
            self._logits = torch.empty(shape, dtype=self.dtype, device=self.device)
        return self._logits


class SlotGenerator:
    """Continuous batching over a :class:`FastModel` (see the module docstring).

    Args:
        model: the fast forward.
        graphs: capture decode steps as CUDA graphs (None: on CUDA devices).
        gpu_memory_utilization: share of the device's memory the engine may fill.
        max_rows: cap on concurrent rows (None: as many as fit).
        prefill_tokens: tokens per prefill chunk (None: from a memory budget).
        check_every: decode steps between host syncs (finished rows are retired then).
        kv_dtype: the KV cache's dtype (None: the model's; ``torch.float8_e4m3fn``: half the
            bytes of bf16, so twice the slots and half the attention reads, at fp8 precision).
    """

    prefill_runs = True  # eager LoRA in prefill by member runs (False: per row, as the kernels)

    def __init__(
        self,
        model: FastModel,
        graphs: bool | None = None,
        gpu_memory_utilization: float = 0.9,
        max_rows: int | None = None,
        prefill_tokens: int | None = None,
        check_every: int = 8,
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        self.model, self.kv_dtype = model, kv_dtype
        self.device = model.embed.device
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        self.utilization, self.max_rows = gpu_memory_utilization, max_rows
        self.prefill_tokens, self.check_every = prefill_tokens, check_every
        self.workspace: SlotWorkspace | None = None
        self.plan: SlotPlan | None = None
        self._asked: tuple[object, ...] = ()
        self._rows = self._cols = 0  # rows and LoRA columns the current plan was made for
        self._logged: set[str] = set()  # plans already logged at INFO
        self.last_timings: dict[str, float] = {}
        self.name = "the model"  # named in the planner's error

    # -- planning ------------------------------------------------------------------------
    def _per_token(self) -> int:
        m = self.model
        return (2 * m.inter + 4 * m.hidden + m.q_out + 2 * m.kv_out) * 3 * m.embed.element_size()

    def _prefill_budget(self) -> int:
        """Tokens per prefill chunk."""
        if self.prefill_tokens is not None:
            return self.prefill_tokens
        total = 0
        if self.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.device).total_memory
        limit = max(MIN_PREFILL_BYTES, int(PREFILL_SHARE * total))
        return max(1, limit // self._per_token())

    def shape(self, lora: FastLora | None, name: str = "model") -> Shape:
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
            name=name,
            dtype=str(m.embed.dtype).removeprefix("torch."),
            kv_itemsize=(self.kv_dtype or m.embed.dtype).itemsize,
        )

    def prepare(self, rows: int, positions: int, greedy: bool, lora: FastLora | None) -> SlotPlan:
        """Plan the slots and allocate them, or reuse the workspace while it fits: as many
        slots and positions or more, the same settings (a run's evaluations, fewer rows than
        its generations, then keep the generations' workspace and graphs)."""
        positions = -(-positions // 16) * 16
        ws = self.workspace
        key = (self.model.lm_head.weight.data_ptr(), self.model.weights_version)
        asked = (greedy, self.max_rows, self.utilization, self.kv_dtype)
        if ws is not None and self.plan is not None and ws.key == key and self._asked == asked:
            every_row = ws.slots >= rows and ws.positions >= positions
            # fewer slots than its rows: memory or max_batch_rows capped it, as they would again
            # (for no wider LoRA activations than it was planned with)
            cols = lora_cols(lora)
            capped = ws.slots < self._rows and ws.positions == positions and cols <= self._cols
            if every_row or capped:
                return self.plan
        self.workspace = None  # free the old cache before measuring
        prefill = self._prefill_budget() * self._per_token()
        plan = plan_slots(
            self.shape(lora, self.name),
            rows,
            positions,
            greedy,
            prefill,
            self.utilization,
            self.max_rows,
            device_memory(self.device),
        )
        try:
            self.workspace = SlotWorkspace(self.model, plan.slots, positions, self.kv_dtype)
        except torch.OutOfMemoryError as e:  # the plan's arithmetic was off: say so, with numbers
            raise RuntimeError(f"out of memory allocating {plan.describe()}: {e}") from e
        self.plan, self._asked, self._rows, self._cols = plan, asked, rows, lora_cols(lora)
        text = plan.describe()  # each plan once at INFO (eval and train alternate plans)
        log.log(
            logging.DEBUG if text in self._logged else logging.INFO, "continuous batching: %s", text
        )
        self._logged.add(text)
        return plan

    # -- generation ----------------------------------------------------------------------
    @torch.inference_mode()
    def generate(
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
    ) -> Tensor:
        """New tokens ``[rows, <= max(budgets)]`` for left-padded rows ``input_ids [rows, L]``;
        row ``i`` is member ``member[i]`` of ``lora`` (None: the base model) and stops after
        ``budgets[i]`` tokens or an EOS (then ``pad_id``)."""
        timer = PhaseTimer(self.device)
        rows, length = input_ids.shape
        if len(budgets) != rows or min(budgets) < 1:
            raise ValueError("one budget >= 1 per row")
        greedy = sampling.temperature == 0
        widest = max(budgets)
        self.prepare(rows, length + widest, greedy, lora)
        ws = self.workspace
        assert ws is not None
        dev = self.device
        members = (
            torch.zeros(rows, dtype=torch.long, device=dev) if member is None else member.to(dev)
        )
        budget_t = torch.tensor(list(budgets), dtype=torch.long, device=dev)
        eos = torch.tensor(list(eos_ids), dtype=torch.long, device=dev)
        out = torch.full((rows * widest + 1,), pad_id, dtype=torch.long, device=dev)
        mask = attention_mask.to(dev).bool()
        ids = input_ids.to(dev)
        order = sorted(range(rows), key=lambda r: -budgets[r])
        queue, free = deque(order), list(range(ws.slots - 1, -1, -1))
        active: list[int] = []
        # with LoRA, prefills and decode batches keep their rows sorted by member, so the fused
        # kernels' row tiles mostly hold one member and read its second factors once
        member_of = members.tolist() if lora is not None else None
        slot_member = [0] * ws.slots
        refill = max(1, ws.slots // 16)
        steps = prefills = batch = busy = padded = 0
        spans: list[tuple[object, object]] = []  # (start, end) of each prefill: its time
        while queue or active:
            if queue and (not active or len(free) >= refill):
                take = min(len(free), len(queue))
                chosen = [queue.popleft() for _ in range(take)]
                slots = [free.pop() for _ in range(take)]
                if member_of is not None:
                    chosen.sort(key=member_of.__getitem__)
                    for row, slot in zip(chosen, slots, strict=True):
                        slot_member[slot] = member_of[row]
                begin = timer.now()
                self._prefill(
                    ws, ids, mask, chosen, slots, members, budget_t, lora, sampling,
                    eos, out, widest, generator,
                )  # fmt: skip
                spans.append((begin, timer.now()))
                prefills += 1
                active += slots
                if member_of is not None:
                    active.sort(key=slot_member.__getitem__)
                    # the bucket's padding rows (the scratch slot) join the last member's tile
                    ws.member[ws.slots] = slot_member[active[-1]]
                batch = self._set_batch(ws, active)
            for _ in range(self.check_every):
                self._step(ws, batch, lora, sampling, eos, out, widest, generator)
                steps += 1
            busy, padded = busy + len(active) * self.check_every, padded + batch * self.check_every
            done = ws.done[ws.sel[: len(active)]].tolist()
            if any(done):
                free += [s for s, d in zip(active, done, strict=True) if d]
                active = [s for s, d in zip(active, done, strict=True) if not d]
                batch = self._set_batch(ws, active) if active else 0
        timer.mark("generate_s")
        self.last_timings = timer.done()
        self.last_timings.update(
            steps=float(steps),
            prefills=float(prefills),
            prefill_s=sum(timer.between(a, b) for a, b in spans),
            slots=ws.slots,
            # per decode step: rows in the batch (counted at each sync: rows that finished
            # since then count until they are retired), and the bucket's idle share beyond them
            rows_per_step=busy / max(1, steps),
            padding=1 - busy / max(1, padded),
        )
        return out[:-1].view(rows, widest)

    def _set_batch(self, ws: SlotWorkspace, active: list[int]) -> int:
        """Batch rows ``0..len(active)`` -> the active slots; the rest of the bucket -> scratch."""
        n = len(active)
        size = next(b for b in buckets(ws.slots) if b >= n)
        sel = torch.full((size,), ws.slots, dtype=torch.long)
        sel[:n] = torch.tensor(active, dtype=torch.long)
        ws.sel[:size].copy_(sel, non_blocking=False)
        return size

    def _prefill(
        self,
        ws: SlotWorkspace,
        ids: Tensor,
        mask: Tensor,
        chosen: list[int],
        slots: list[int],
        members: Tensor,
        budgets: Tensor,
        lora: FastLora | None,
        sampling: Sampling,
        eos: Tensor,
        out: Tensor,
        widest: int,
        generator: torch.Generator | None,
    ) -> None:
        """Prompts of rows ``chosen`` into ``slots``; each row's first token."""
        dev, length = self.device, ids.shape[1]
        rows_t = torch.tensor(chosen, dtype=torch.long, device=dev)
        slots_t = torch.tensor(slots, dtype=torch.long, device=dev)
        chunk = max(1, self._prefill_budget() // length)
        runs = lora is not None and self.prefill_runs and self.model.ops.mode != "triton"
        for lo in range(0, len(chosen), chunk):
            r, s = rows_t[lo : lo + chunk], slots_t[lo : lo + chunk]
            mem = members[r]
            m = mask[r]
            positions = (m.long().cumsum(-1) - 1).clamp(min=0)
            cos, sin = ws.cos[positions], ws.sin[positions]
            pmask = None if bool(m.all()) else prefill_mask(m, ws.dtype)
            view: FastLoraRows | None = None
            if lora is not None:  # rows sorted by member (generate): eager LoRA takes one small
                # GEMM per member's run of tokens, the Triton kernels one Bt read per tile
                per_token = mem.repeat_interleave(length)
                runs_of = member_runs(mem.tolist(), length) if runs else None
                view = lora.rows(per_token) if runs_of is None else lora.runs(per_token, runs_of)
            logits = self.model.prefill(ids[r], cos, sin, pmask, ws.cache, s, view)
            first = next_token(logits, sampling, generator)
            ws.lens[s] = length
            ws.start[s] = length - m.sum(-1)
            ws.member[s] = mem
            ws.row[s] = r
            ws.budget[s] = budgets[r]
            ws.tok[s] = first
            ws.gen[s] = 1
            out[r * widest] = first
            ws.done[s] = torch.isin(first, eos) | (budgets[r] <= 1)

    def _step(
        self,
        ws: SlotWorkspace,
        batch: int,
        lora: FastLora | None,
        sampling: Sampling,
        eos: Tensor,
        out: Tensor,
        widest: int,
        generator: torch.Generator | None,
    ) -> None:
        greedy = sampling.temperature == 0
        sel = ws.sel[:batch]

        def run() -> None:
            pos, lo = ws.lens[sel], ws.start[sel]
            rope = pos - lo
            cos, sin = ws.cos[rope], ws.sin[rope]
            view = None if lora is None else lora.rows(ws.member[sel])
            x = self.model.decode_slots(ws.tok[sel], cos, sin, sel, pos, lo, ws.cache, view)
            if greedy:
                self.model.greedy(x, ws.next[:batch], ws.scratch)
            else:
                self.model.logits(x, out=ws.logits[:batch])

        if self.graphs:
            key = (batch, id(lora), greedy)
            if key not in ws.graphs:
                ws.graphs[key] = (capture(run, ws.pool), lora)
            ws.graphs[key][0].replay()  # type: ignore[attr-defined]
        else:
            run()
        nxt = ws.next[:batch] if greedy else next_token(ws.logits[:batch], sampling, generator)
        live = ~ws.done[sel]
        gen = ws.gen[sel]
        dump = out.shape[0] - 1
        at = torch.where(live, ws.row[sel] * widest + gen.clamp(max=widest - 1), dump)
        out[at] = torch.where(live, nxt, out[dump])
        ws.tok[sel] = nxt
        step = live.long()
        ws.gen[sel] = gen + step
        ws.lens[sel] = ws.lens[sel] + step
        ws.done[sel] = ~live | torch.isin(nxt, eos) | (gen + step >= ws.budget[sel])
