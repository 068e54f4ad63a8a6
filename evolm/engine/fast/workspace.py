"""The static buffers of the fast path's generation and their shape constants (how many bytes
they may take: :mod:`.plan`).

A :class:`Workspace` holds a fixed set of *slots*. Each slot holds one row's KV cache
(``[layers, slots + 1, kv_heads, T, head_dim]``; the extra slot is scratch for the padding rows
of a batch bucket) and its state: cache length ``lens`` (the next write position), ``start``
(left padding of its prompt), ``member``, tokens generated ``gen``, its ``budget`` (the row's own
max_new_tokens), ``row`` (its index in the caller's rows), ``stop`` (its stop-string automaton's
state, :mod:`evolm.engine.stops`) and ``done`` (EOS, budget or a stop string reached).
``sel[:B]`` maps the rows of the current decode batch to slots. With speculative decoding
(:mod:`.speculate`) a slot also holds its token history ``hist``, aligned with its cache
(``hist[slot, p]``: the token at cache position ``p``), which the verify step drafts from.

Everything a captured step reads or writes lives here, never in a caller's per-call tensors:
the verify step's outputs and counters (:class:`SpecBuffers`) and the small constant tensors it
compares against (:meth:`Workspace.ids`) are kept, as their graphs bake in their addresses.

CUDA graphs bake in buffer addresses: :func:`graph_key` is the ONE key that says when a
workspace (and its graphs) must be rebuilt: a replaced LM-head weight or bias, or reallocated
(or quantized) projection weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from evolm.engine.fast.model import FastModel

MiB = 2**20
GREEDY_ROWS = 1024  # rows per greedy LM-head block (H100, 1.5B shape: 1.31 ms vs 1.78 at 256)
BUCKETS = 16  # graphs per (adapters, greedy): eighths padded the fp8 cache's 4,074 slots 6.8%
CHECK_EVERY = 8  # decode steps between host syncs (finished rows are retired then)


def graph_key(model: FastModel) -> tuple[int, int, int]:
    """What the captured graphs depend on beyond the workspace's own buffers."""
    bias = model.lm_head.bias
    ptr = 0 if bias is None else bias.data_ptr()
    return model.lm_head.weight.data_ptr(), ptr, model.weights_version


def buckets(slots: int) -> list[int]:
    """Batch sizes with a graph: sixteenths of ``slots`` and powers of two below them."""
    out = {max(1, -(-slots * k // BUCKETS)) for k in range(1, BUCKETS + 1)}
    p = 1
    while p < slots / BUCKETS:
        out.add(p)
        p *= 2
    return sorted(out)


def bucket(capacity: int, n: int) -> int:
    """The smallest of :func:`buckets` of ``capacity`` that holds ``n`` rows."""
    return next(b for b in buckets(capacity) if b >= n)


@dataclass(frozen=True)
class SpecBuffers:
    """The kept tensors of speculative decoding's verify step (:mod:`.speculate`), for rows of
    ``width`` tokens (its current one and ``width - 1`` drafts): as many rows as one forward of
    ``slots`` verify rows holds. ``chosen [rows, width]``: greedy's choice after each token;
    ``at [rows, width]``: where each goes in the caller's ``out`` (its dump cell where not
    kept); ``shape [2]``: that ``out``'s row width and dump index (set once per generation);
    ``kept``: tokens the verify steps produced since, ``rows``: the running rows they verified
    (0-dim each)."""

    chosen: Tensor
    at: Tensor
    shape: Tensor
    kept: Tensor
    rows: Tensor


class Workspace:
    """The static slot buffers (see the module docstring)."""

    def __init__(
        self,
        model: FastModel,
        slots: int,
        positions: int,
        kv_dtype: torch.dtype | None = None,
        history: bool = False,
    ) -> None:
        dev = model.embed.device
        self.slots, self.positions, self.device = slots, positions, dev
        self.cache = model.new_cache(slots + 1, positions, kv_dtype)
        self.cos, self.sin = model.rope_tables(positions)

        def z(dtype: torch.dtype = torch.long) -> Tensor:
            return torch.zeros(slots + 1, dtype=dtype, device=dev)

        self.lens, self.start, self.member = z(), z(), z()
        self.gen, self.budget, self.row = z(), z(), z()
        self.tok, self.stop, self.done = z(), z(), z(torch.bool)
        self.done[slots] = True  # the scratch slot never advances
        self.sel = torch.full((slots,), slots, dtype=torch.long, device=dev)
        self.next = torch.zeros(slots, dtype=torch.long, device=dev)
        # each slot's tokens by cache position (speculative decoding drafts from them; right
        # for ``start <= p < lens``, the current token written at ``lens`` as it is fed)
        self.hist = (
            torch.zeros((slots + 1, positions), dtype=torch.long, device=dev) if history else None
        )
        self._ids: dict[tuple[int, ...], Tensor] = {}
        self._spec: dict[int, SpecBuffers] = {}
        self.vocab, self.dtype = model.lm_head.weight.shape[0], model.embed.dtype
        self.greedy_rows = min(slots, GREEDY_ROWS)
        self.graphs: dict[tuple[object, ...], tuple[torch.cuda.CUDAGraph, object]] = {}
        self.pool = torch.cuda.graph_pool_handle() if dev.type == "cuda" else None
        self.key = graph_key(model)

    @cached_property
    def scratch(self) -> Tensor:
        """``[greedy_rows, vocab]``: greedy's logits, a block of rows at a time (allocated at
        first use)."""
        return torch.empty((self.greedy_rows, self.vocab), dtype=self.dtype, device=self.device)

    @cached_property
    def logits(self) -> Tensor:
        """``[slots, vocab]`` logits for sampling (allocated at first use; greedy needs none)."""
        return torch.empty((self.slots, self.vocab), dtype=self.dtype, device=self.device)

    def ids(self, values: Sequence[int]) -> Tensor:
        """``values`` as a long tensor on the device, kept per tuple of values (a captured step
        compares against it: e.g. the EOS ids)."""
        key = tuple(values)
        if key not in self._ids:
            self._ids[key] = torch.tensor(key, dtype=torch.long, device=self.device)
        return self._ids[key]

    def speculation(self, width: int) -> SpecBuffers:
        """The :class:`SpecBuffers` of verify rows of ``width`` tokens (allocated at first use,
        kept: the verify graphs bake in their addresses)."""
        if width not in self._spec:
            rows = self.slots // width

            def z(*shape: int) -> Tensor:
                return torch.zeros(shape, dtype=torch.long, device=self.device)

            self._spec[width] = SpecBuffers(z(rows, width), z(rows, width), z(2), z(), z())
        return self._spec[width]

    def set_batch(self, active: list[int]) -> int:
        """Batch rows ``0..len(active)`` -> the active slots; the rest of the bucket (its size,
        returned) -> the scratch slot."""
        n = len(active)
        size = bucket(self.slots, n)
        sel = torch.full((size,), self.slots, dtype=torch.long)
        sel[:n] = torch.tensor(active, dtype=torch.long)
        self.sel[:size].copy_(sel, non_blocking=False)
        return size
