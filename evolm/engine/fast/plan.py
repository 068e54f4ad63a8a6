"""The memory planner of continuous batching: how many rows (slots) decode at once.

All of the fast path's memory sizing is here, with ONE activation formula
(:func:`activation_bytes`: the transients of one token of a forward, a prompt token in a prefill
or a row in a decode step). A slot holds one row's KV cache at full length (prompt + its token
budget) plus one token's activations (when sampling, also its logits and the sampler's fp32
transients; with speculative decoding, its tokens by position: 8 bytes each). The fixed part
is the prefill chunk's transients (:func:`prefill_tokens` tokens of the base model's
activations), greedy's logit block and a margin for the CUDA graphs and the allocator. On a GPU
the budget is ``gpu_memory_utilization x total`` minus what is already in use (the weights,
the adapter buffers, other processes), measured once the model and adapters are resident::

    slots = min(rows, max_batch_rows, (util * total - used - fixed) // per_slot)

When not even one slot fits, :func:`plan_slots` raises one :class:`ConfigError` naming the keys
that fix it and the numbers, instead of a CUDA out-of-memory error halfway through a run.

On a CPU every row gets a slot (capped by ``max_batch_rows``): the slot count is never taken
from the machine's free memory, which varies, so the same config decodes in the same batches
on every machine. When those slots, their prefill chunk and greedy's logit block would not fit
in the memory free now (:func:`host_memory`: the machine's, or its container's limit, shared by
the ranks on it), :func:`plan_slots` raises a :class:`ConfigError` naming
``server.max_batch_rows`` and a value that fits, instead of an allocator failure or the
kernel's OOM killer (the 0.5B's countdown eval on a 24 GB machine: 2,000 rows of 1,408
positions in fp32, 74 GiB).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import torch

from evolm.engine.fast.workspace import GREEDY_ROWS, MiB
from evolm.errors import ConfigError

GiB = 2**30
MIN_PREFILL_BYTES = 256 * MiB  # prefill transients: at least this, or ...
PREFILL_SHARE = 0.04  # ... this share of the device memory
SLOT_STATE_BYTES = 64  # a slot's own state (lens, start, member, ...: eight longs)
HISTORY_BYTES = 8  # per cache position of a slot's token history (speculative decoding: int64)
MARGIN = 512 * MiB  # CUDA graphs' own memory, allocator fragmentation, cuBLAS workspaces
SAMPLER_BYTES = 24  # per vocabulary entry and row when sampling: fp32 probs, sort, cumsum


@dataclass(frozen=True)
class SlotPlan:
    """The outcome of :func:`plan_slots` (bytes; ``budget`` = what slots may take)."""

    slots: int
    positions: int
    per_slot: int
    fixed: int
    budget: int
    total: int

    def describe(self) -> str:
        sizes = (
            f"{self.slots} slots x {self.positions} positions, {self.per_slot / MiB:.1f} MiB "
            f"per slot + {self.fixed / MiB:.0f} MiB fixed"
        )
        if not self.total:  # a CPU: no device memory to budget (server.max_batch_rows caps)
            return f"{sizes} (host memory, no device budget)"
        return f"{sizes}, budget {self.budget / GiB:.1f} GiB of {self.total / GiB:.1f} GiB"


@dataclass(frozen=True)
class Shape:
    """What the planner needs of the model (from :class:`FastModel`)."""

    layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    inter: int
    q_out: int
    vocab: int
    itemsize: int
    weight_bytes: int
    lora_cols: int = 0  # every member's rank columns the base GEMMs also produce
    name: str = "model"
    dtype: str = "bfloat16"
    kv_itemsize: int = 0  # bytes per KV-cache element (0: ``itemsize``; 1: an fp8 cache)


def activation_bytes(shape: Shape) -> int:
    """The one activation formula: bytes of one token's transients in a forward (a prompt token
    of a prefill chunk, or a row of a decode step). Three live copies of the widest tensors of a
    layer (the MLP's gate/up and its down input, the residual stream and norms, q/k/v), plus
    two of the rank columns that the base GEMMs produce for the adapters."""
    kv_out = shape.kv_heads * shape.head_dim
    width = 3 * (2 * shape.inter + 4 * shape.hidden + shape.q_out + 2 * kv_out)
    return (width + 2 * shape.lora_cols) * shape.itemsize


def prefill_tokens(shape: Shape, total: int, tokens: int | None = None) -> int:
    """Tokens per prefill chunk: ``tokens`` where set (a benchmark's knob), else as many as
    ``max(MIN_PREFILL_BYTES, PREFILL_SHARE x total)`` bytes hold of the base model's
    activations (``total``: the device's memory, 0 on CPUs); the chunk's rank columns ride in
    the margin, so the chunks do not depend on the adapters."""
    if tokens is not None:
        return tokens
    limit = max(MIN_PREFILL_BYTES, int(PREFILL_SHARE * total))
    return max(1, limit // activation_bytes(replace(shape, lora_cols=0)))


def plan_slots(
    shape: Shape,
    rows: int,
    positions: int,
    greedy: bool,
    chunk_tokens: int,
    utilization: float,
    max_rows: int | None,
    memory: tuple[int, int] | None,
    host: tuple[int, int] | None = None,
    *,
    history: bool = False,
) -> SlotPlan:
    """Slots for ``rows`` rows of ``positions`` cache positions each, beside a prefill chunk of
    ``chunk_tokens`` tokens (:func:`prefill_tokens`); ``history``: each slot also keeps its
    tokens by position (speculative decoding, :attr:`.Workspace.hist`).

    ``memory``: ``(available, total)`` device bytes, ``available`` counting memory the caching
    allocator holds but does not use (None: a CPU: every row, capped by ``max_rows``, checked
    against ``host``, the host's ``(available, total)`` bytes, when given)."""
    cap = rows if max_rows is None else min(rows, max_rows)
    kv_item = shape.kv_itemsize or shape.itemsize
    kv = 2 * shape.layers * shape.kv_heads * shape.head_dim * positions * kv_item
    per_slot = kv + activation_bytes(shape) + SLOT_STATE_BYTES
    if history:
        per_slot += HISTORY_BYTES * positions
    if not greedy:
        per_slot += shape.vocab * (shape.itemsize + SAMPLER_BYTES)
    greedy_block = min(cap, GREEDY_ROWS) * shape.vocab * shape.itemsize if greedy else 0
    prefill = chunk_tokens * activation_bytes(replace(shape, lora_cols=0))
    fixed = prefill + greedy_block + MARGIN
    if memory is None:
        if host is not None:  # no CUDA graphs, no margin: what a CPU allocates
            _check_host(cap, per_slot, prefill + greedy_block, host, shape)
        return SlotPlan(cap, positions, per_slot, fixed, 0, 0)
    available, total = memory
    used = total - available
    budget = int(utilization * total) - used - fixed
    fit = max(0, budget // per_slot)
    if fit < 1:
        raise ConfigError(
            "task.max_new_tokens",
            f"one row needs {per_slot / MiB:.1f} MiB ({positions} cache positions x "
            f"{kv // positions / 1024:.0f} KiB of KV for {shape.name} in {shape.dtype}"
            f"{', fp8 cache' if kv_item == 1 else ''}, plus "
            f"activations), but server.gpu_memory_utilization={utilization} of "
            f"{total / GiB:.1f} GiB leaves {max(budget, 0) / MiB:.0f} MiB after "
            f"{used / GiB:.1f} GiB in use (weights {shape.weight_bytes / GiB:.1f} GiB, adapters, "
            f"other processes) and {fixed / MiB:.0f} MiB of prefill/graph buffers",
            "lower task.max_new_tokens (or the prompt length), raise "
            "server.gpu_memory_utilization, set server.kv_cache_dtype=fp8 (half the KV bytes), "
            "or use a smaller model or dtype",
        )
    if max_rows is not None and min(rows, max_rows) > fit:
        raise ConfigError(
            "server.max_batch_rows",
            f"{min(rows, max_rows)} concurrent rows need "
            f"{min(rows, max_rows) * per_slot / GiB:.1f} GiB; at most {fit} fit in "
            f"{budget / GiB:.1f} GiB (server.gpu_memory_utilization={utilization})",
            f"set server.max_batch_rows <= {fit}, or null to use as many as fit",
        )
    return SlotPlan(min(cap, fit), positions, per_slot, fixed, budget, total)


def _check_host(slots: int, per_slot: int, fixed: int, host: tuple[int, int], shape: Shape) -> None:
    """A CPU's ``slots`` (and ``fixed`` bytes beside them) must fit in ``host``'s available
    bytes: what would not is refused, naming the key that fixes it."""
    available, total = host
    fit = (available - fixed) // per_slot
    if slots <= fit:
        return
    need = f"{slots} rows decoding at once need {(slots * per_slot + fixed) / GiB:.1f} GiB"
    where = f"this machine has {available / GiB:.1f} GiB of {total / GiB:.1f} free"
    if fit < 1:
        raise ConfigError(
            "task.max_new_tokens",
            f"on this CPU, {need} ({per_slot / MiB:.1f} MiB a row: {shape.name}'s KV cache "
            f"and activations in {shape.dtype}, plus {fixed / MiB:.0f} MiB of prefill and "
            f"logits); {where}: not even one row fits",
            "lower task.max_new_tokens (or the prompt length), free memory, or use a smaller "
            "model or dtype",
        )
    raise ConfigError(
        "server.max_batch_rows",
        f"on this CPU, {need} ({per_slot / MiB:.1f} MiB a row: its KV cache and activations); "
        f"{where}: {fit} rows fit",
        f"set server.max_batch_rows={fit} or fewer (a fixed value decodes alike on every "
        "machine), or lower task.max_new_tokens",
    )


def _cgroup_free() -> int | None:
    """Bytes left under this process's cgroup (v2) memory limit; None without one."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(0, int(limit) - used)


def host_memory() -> tuple[int, int]:
    """``(available, total)`` bytes of this machine's memory for one rank's CPU engine: the
    machine's available memory, or its container's if less, split among the ranks that
    ``torchrun`` started on it (``LOCAL_WORLD_SIZE``)."""
    memory = psutil.virtual_memory()
    available = memory.available
    cgroup = _cgroup_free()
    if cgroup is not None:
        available = min(available, cgroup)
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return available // ranks, memory.total


def total_memory(device: torch.device) -> int:
    """The device's memory in bytes (0 on CPUs: no device budget)."""
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_properties(device).total_memory


def device_memory(device: torch.device) -> tuple[int, int] | None:
    """``(available, total)`` bytes of a CUDA device (None on CPUs); ``available`` includes what
    torch's caching allocator holds unused."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    idle = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return free + idle, total
