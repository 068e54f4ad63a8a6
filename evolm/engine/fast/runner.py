"""Population generation on the fast forward: chunked prefill, then graph-replayed decode steps.

- Prefill runs the prompts in chunks of whole members (a token budget keeps the transient
  activations small next to the weights and cache), keeping only last-position logits.
- Decode steps run over a static workspace (KV cache, token / position / slot buffers, logits):
  step ``t`` writes cache slot ``L + t`` and attends over the first ``E`` slots, ``E`` the next
  multiple of ``bucket``. On CUDA each ``(E, adapters, greedy)`` step is captured once as a CUDA
  graph and replayed (a handful of graphs per shape; they share one memory pool). Sampling runs
  outside the graph, so it uses the caller's ``torch.Generator``; greedy decoding's LM head and
  argmax run inside it, a block of rows at a time, so no ``[rows, vocab]`` logits are held.
- The host syncs only to check for EOS every ``check_every`` steps (never when ``eos_ids`` is
  empty). Rows that finished early still run until every row has (no batch compaction).

The workspace is kept between calls and rebuilt when the row count grows or shrinks or a longer
sequence is needed; ES calls repeat one shape, so after the first call nothing is allocated or
captured.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from evolm.engine.fast.cudagraph import PhaseTimer, capture
from evolm.engine.fast.lora import FastLora
from evolm.engine.fast.model import FastModel, prefill_mask
from evolm.engine.hf.generation import next_token
from evolm.sampling import Sampling

MIN_PREFILL_BYTES = 64 * 2**20
PREFILL_SHARE = 0.04  # prefill transients <= this share of (weights + KV cache), or the minimum
GREEDY_ROWS = 256  # greedy decoding computes the LM head at least this many rows at a time,
GREEDY_SHARE = 0.02  # or as many as fit in this share of (weights + KV cache): all rows for 7B


class Workspace:
    """Static buffers for ``rows`` rows and ``slots`` cache slots (see the module docstring)."""

    def __init__(self, model: FastModel, rows: int, slots: int) -> None:
        dev, dtype = model.embed.device, model.embed.dtype
        self.rows, self.slots = rows, slots
        self.key = self.model_key(model)
        self.cache = model.new_cache(rows, slots)
        self.cos, self.sin = model.rope_tables(slots)
        self.tokens = torch.zeros(rows, dtype=torch.long, device=dev)
        self.positions = torch.zeros(rows, dtype=torch.long, device=dev)
        self.slot = torch.zeros(1, dtype=torch.long, device=dev)
        self.prompt_bias = torch.zeros(rows, slots, dtype=dtype, device=dev)
        self.arange = torch.arange(slots, device=dev)
        self.neg = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=dev)
        self.next_tokens = torch.zeros(rows, dtype=torch.long, device=dev)  # greedy's argmax
        self.vocab, self.dtype, self.device = model.lm_head.weight.shape[0], dtype, dev
        held = model.weight_bytes() + self.nbytes()
        fit = int(GREEDY_SHARE * held // (self.vocab * dtype.itemsize))
        self.greedy_rows = min(rows, max(GREEDY_ROWS, fit))
        self._logits: Tensor | None = None
        self._scratch: Tensor | None = None
        self.graphs: dict[tuple[int, int, bool], tuple[torch.cuda.CUDAGraph, FastLora | None]] = {}
        self.pool = torch.cuda.graph_pool_handle() if dev.type == "cuda" else None

    @property
    def logits(self) -> Tensor:
        """``[rows, vocab]`` logits for sampling (allocated at first use; greedy needs none)."""
        if self._logits is None:
            self._logits = torch.empty(self.rows, self.vocab, dtype=self.dtype, device=self.device)
        return self._logits

    @property
    def scratch(self) -> Tensor:
        """``[greedy_rows, vocab]``: greedy's logits, a block of rows at a time."""
        if self._scratch is None:
            shape = (self.greedy_rows, self.vocab)
            self._scratch = torch.empty(shape, dtype=self.dtype, device=self.device)
        return self._scratch

    @staticmethod
    def model_key(model: FastModel) -> tuple[int, int, int]:
        """Graphs bake in addresses: a replaced lm_head weight or bias, or reallocated (or
        quantized) projection weights, need new ones."""
        bias = model.lm_head.bias
        ptr = 0 if bias is None else bias.data_ptr()
        return model.lm_head.weight.data_ptr(), ptr, model.weights_version

    def nbytes(self) -> int:
        return self.cache.k.nbytes + self.cache.v.nbytes


class FastGenerator:
    """Generates for a batch of member-major rows on a :class:`FastModel`.

    Args:
        model: the fast forward.
        graphs: capture decode steps as CUDA graphs (None: on CUDA devices).
        bucket: decode attends over cache slots in multiples of this (one graph per multiple).
        prefill_tokens: tokens per prefill chunk (None: from a memory budget).
    """

    def __init__(
        self,
        model: FastModel,
        graphs: bool | None = None,
        bucket: int = 32,
        prefill_tokens: int | None = None,
    ) -> None:
        self.model = model
        self.device = model.embed.device
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        self.bucket, self.prefill_tokens = bucket, prefill_tokens
        self.workspace: Workspace | None = None
        self.last_timings: dict[str, float] = {}

    @torch.inference_mode()
    def generate(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        lora: FastLora | None,
        sampling: Sampling,
        eos_ids: Sequence[int],
        pad_id: int,
        generator: torch.Generator | None = None,
        check_every: int = 8,
    ) -> Tensor:
        """New tokens ``[rows, <= max_new_tokens]`` (after a row's EOS: ``pad_id``), as
        :func:`evolm.engine.hf.generation.generate_tokens`. ``lora`` holds ``rows / P`` members."""
        timer = PhaseTimer(self.device)
        greedy = sampling.temperature == 0
        ws = self.start(input_ids, attention_mask, lora, sampling.max_new_tokens, greedy)
        timer.mark("prefill_s")
        length = input_ids.shape[1]
        tokens = self._decode(ws, length, lora, sampling, eos_ids, pad_id, generator, check_every)
        timer.mark("decode_s")
        self.last_timings = timer.done()
        self.last_timings["steps"] = float(tokens.shape[1])
        return tokens

    @torch.inference_mode()
    def forced_logits(
        self, input_ids: Tensor, attention_mask: Tensor, lora: FastLora | None, forced: Tensor
    ) -> Tensor:
        """Logits ``[rows, T + 1, vocab]`` after the prompt and after each of the ``T`` tokens
        of ``forced [rows, T]`` fed through the decode path (checks against a reference)."""
        ws = self.start(input_ids, attention_mask, lora, forced.shape[1] + 1)
        out = [ws.logits.clone()]
        for t in range(forced.shape[1]):
            self.advance(ws, forced[:, t], t, input_ids.shape[1], lora)
            out.append(ws.logits.clone())
        return torch.stack(out, dim=1)

    def start(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        lora: FastLora | None,
        new_tokens: int,
        greedy: bool = False,
    ) -> Workspace:
        """Prefill (call under inference mode): the workspace's logits (greedy: its
        ``next_tokens``) are the first token's."""
        rows, length = input_ids.shape
        ws = self._workspace(rows, length + new_tokens)
        members = 1 if lora is None else lora.members
        self._prefill(ws, input_ids, attention_mask.bool(), lora, members, greedy)
        ws.positions.copy_(attention_mask.sum(-1))
        ws.slot.fill_(length)
        return ws

    def advance(
        self,
        ws: Workspace,
        token: Tensor,
        t: int,
        length: int,
        lora: FastLora | None,
        greedy: bool = False,
    ) -> None:
        """Decode step ``t``: feed ``token [rows]``; the workspace's logits (greedy: its
        ``next_tokens``) are the next token's."""
        ws.tokens.copy_(token)
        self._step(ws, -(-(length + t + 1) // self.bucket) * self.bucket, lora, greedy)
        ws.positions.add_(1)
        ws.slot.add_(1)

    def _workspace(self, rows: int, needed: int) -> Workspace:
        slots = -(-needed // self.bucket) * self.bucket
        ws = self.workspace
        if ws is None or ws.rows != rows or ws.slots < slots or ws.key != ws.model_key(self.model):
            self.workspace = ws = None  # free the old cache before allocating the new one
            ws = self.workspace = Workspace(self.model, rows, slots)
        return ws

    def _chunk_members(self, rows_per_member: int, length: int, ws: Workspace) -> int:
        m = self.model
        if self.prefill_tokens is not None:
            budget = self.prefill_tokens
        else:
            per_token = (
                2 * m.inter + 4 * m.hidden + m.q_out + 2 * m.kv_out
            ) * m.embed.element_size()
            limit = max(MIN_PREFILL_BYTES, PREFILL_SHARE * (m.weight_bytes() + ws.nbytes()))
            budget = int(limit // per_token)
        return max(1, budget // (rows_per_member * length))

    def _prefill(
        self,
        ws: Workspace,
        ids: Tensor,
        mask: Tensor,
        lora: FastLora | None,
        members: int,
        greedy: bool,
    ) -> None:
        rows, length = ids.shape
        per_member = rows // members if lora is not None else 1
        chunk = per_member * self._chunk_members(per_member, length, ws)
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        cos, sin = ws.cos[positions], ws.sin[positions]
        padded = not bool(mask.all())
        ws.prompt_bias.zero_()
        ws.prompt_bias[:, :length].masked_fill_(~mask, torch.finfo(ws.dtype).min)
        for lo in range(0, rows, chunk):
            sl = slice(lo, min(rows, lo + chunk))
            view = None if lora is None else lora.view(lo // per_member, sl.stop // per_member)
            pmask = prefill_mask(mask[sl], ws.dtype) if padded else None
            logits = self.model.prefill(ids[sl], cos[sl], sin[sl], pmask, ws.cache, sl, view)
            if greedy:
                torch.argmax(logits, dim=-1, out=ws.next_tokens[sl])
            else:
                ws.logits[sl] = logits

    def _decode(
        self,
        ws: Workspace,
        length: int,
        lora: FastLora | None,
        sampling: Sampling,
        eos_ids: Sequence[int],
        pad_id: int,
        generator: torch.Generator | None,
        check_every: int,
    ) -> Tensor:
        new = sampling.max_new_tokens
        eos = torch.tensor(list(eos_ids), dtype=torch.long, device=self.device)
        out = torch.full((ws.rows, new), pad_id, dtype=torch.long, device=self.device)
        finished = torch.zeros(ws.rows, dtype=torch.bool, device=self.device)
        greedy = sampling.temperature == 0
        for t in range(new):
            if greedy:
                token = ws.next_tokens.masked_fill(finished, pad_id)
            else:
                token = next_token(ws.logits, sampling, generator).masked_fill_(finished, pad_id)
            out[:, t] = token
            if len(eos_ids):
                finished |= torch.isin(token, eos)
                if (t + 1) % check_every == 0 and t + 1 < new and bool(finished.all()):
                    return out[:, : t + 1]
            if t + 1 == new:
                break
            self.advance(ws, token, t, length, lora, greedy)
        return out

    def _step(self, ws: Workspace, slots: int, lora: FastLora | None, greedy: bool) -> None:
        def run() -> None:
            cos, sin = ws.cos[ws.positions], ws.sin[ws.positions]
            bias = torch.where(ws.arange[:slots] <= ws.slot, ws.prompt_bias[:, :slots], ws.neg)
            x = self.model.decode(ws.tokens, cos, sin, bias, ws.slot, ws.cache, lora)
            if greedy:
                self.model.greedy(x, ws.next_tokens, ws.scratch)
            else:
                self.model.logits(x, out=ws.logits)

        if not self.graphs:
            run()
            return
        key = (slots, id(lora), greedy)  # the entry keeps ``lora`` alive: its id is not reused
        if key not in ws.graphs:
            ws.graphs[key] = (capture(run, ws.pool), lora)
        ws.graphs[key][0].replay()
