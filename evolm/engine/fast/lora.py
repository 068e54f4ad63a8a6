"""Grouped multi-LoRA for the fast path: every member's adapters of a FUSED projection at once.

The fast forward (:mod:`evolm.engine.fast.model`) runs q/k/v as one matmul and gate/up as one. For
a group of ``k`` adapted modules and M members (rows grouped by member, member-major):

- first factors ``A [M, c, in]``: the k modules' A's side by side (``c >= k * r`` rank
  columns), so ``u = x A_m^T [rows, c]`` is every module's rank-space activation. On GPUs
  ``A`` lives in the spare rows of the projection's own weight buffer
  (:meth:`evolm.engine.fast.weights.Proj.reserve`): one GEMM gives the base output AND ``u`` of all
  members (the rows use only their member's columns; the rest is a few % of extra FLOPs, cheaper
  than a launch-bound batched matmul per step; with fp8 base GEMMs the spare rows get their own
  GEMM in the model's dtype). On CPUs ``u`` is one ``bmm``.
- second factors ``Bt [M, r, out]``, compact: module j's ``B_j^T`` (pre-multiplied by
  ``alpha / r``) in its own output columns; its rank-space input is ``u``'s columns
  ``offsets[j] : offsets[j] + r``. The delta ``u_j Bt_j`` is added by the consumer: the RoPE,
  SiLU-and-multiply and residual-add + RMSNorm kernels of :mod:`evolm.engine.kernels.fused`, or
  :func:`lora_delta` eagerly.

The buffers are static: :meth:`FastLora.load` copies a new population into them in place, so
CUDA graphs captured over them stay valid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from evolm.engine.fast.fp8 import Fp8Weight
from evolm.engine.kernels import LoraOperand, tile_members
from evolm.lora.layout import LoraLayout, LoraPopulation

GROUPS: dict[str, tuple[str, ...]] = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}
GROUP_OF = {module: group for group, modules in GROUPS.items() for module in modules}


@dataclass(frozen=True)
class GroupLora:
    """One fused projection's adapters for M members (all, or a range: :meth:`sub`).

    ``A [M, c, in]``; ``Bt [M, r, out]`` (compact, see the module docstring); ``offsets[j]``:
    the first rank column in ``u`` of the group's j-th module (``GROUPS`` order; -1: not
    adapted, its Bt columns are zero); ``splits``: the modules' output widths; ``spare``: the
    weight-buffer rows the base GEMM covers to produce ``u`` of ALL members after its ``out``
    columns (0: ``A`` has its own buffer and ``u`` is a ``bmm``); ``lo``: the first member of
    this range; ``member [rows]``: each row's member (continuous batching: rows of any member in
    any order; None: member-major equal blocks); ``runs``: rows grouped by member in runs of any
    length, ``(member, first row, end row)`` each (eager prefill, ``A`` in its own buffer: one
    small GEMM per run instead of every member's columns for every row); ``tiles``: with
    ``member``, each ``TILE_ROWS``-row tile's one member or -1
    (:func:`evolm.engine.kernels.tile_members`; the fused kernels' fast path).
    """

    A: Tensor
    Bt: Tensor
    offsets: tuple[int, ...]
    splits: tuple[int, ...]
    spare: int = 0
    member: Tensor | None = None
    runs: tuple[tuple[int, int, int], ...] | None = None
    tiles: Tensor | None = None

    @property
    def members(self) -> int:
        return self.A.shape[0]

    @property
    def cols(self) -> int:
        return self.A.shape[1]

    @property
    def rank(self) -> int:
        return self.Bt.shape[1]


@dataclass(frozen=True)
class RankActs:
    """``u``: rank-space activations. Row ``i`` of member ``m`` (0-based in its group range)
    reads columns ``m * member_stride .. + c`` of ``u[i]`` (``member_stride`` 0: ``u`` is
    ``[rows, c]``; ``c``: the group's columns, when ``u`` comes out of the base GEMM, all
    members' columns side by side)."""

    u: Tensor
    member_stride: int

    def per_member(self, members: int, cols: int) -> Tensor:
        """``[M, rows per member, cols]``: each row's own member's columns."""
        rows = self.u.shape[0]
        if self.member_stride == 0:
            return self.u.view(members, rows // members, cols)
        blocks = self.u.reshape(members, rows // members, members, cols)
        return torch.diagonal(blocks, dim1=0, dim2=2).permute(2, 0, 1)


def operand(acts: RankActs | None, lora: GroupLora | None) -> LoraOperand | None:
    """What a fused kernel needs of a group's pending second product (None: no LoRA)."""
    if acts is None or lora is None:
        return None
    return LoraOperand(acts.u, acts.member_stride, lora.Bt, lora.offsets, lora.member, lora.tiles)


def project(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    out: int,
    lora: GroupLora | None,
    fp8: Fp8Weight | None = None,
) -> tuple[Tensor, RankActs | None]:
    """``(bias + x W^T, u)`` for ``x [rows, in]``; ``weight [out + spare rows, in]`` is the
    projection's whole buffer (its first ``out`` rows are W). ``fp8``: W's fp8 copy, which the
    base product then uses (``u`` stays in ``x``'s dtype)."""
    if lora is not None and lora.runs is not None and lora.spare == 0:  # each run its member's
        u = x.new_empty(x.shape[0], lora.cols)
        for m, lo, hi in lora.runs:
            torch.mm(x[lo:hi], lora.A[m].t(), out=u[lo:hi])
        return _linear(x, weight, bias, out, fp8)[0], RankActs(u, 0)
    if lora is not None and lora.member is not None:  # rows of any member: every member's u
        if lora.spare == 0:
            base = _linear(x, weight, bias, out, fp8)[0]
            return base, RankActs(x @ lora.A.reshape(-1, x.shape[-1]).t(), lora.cols)
        base, u = _linear(x, weight, bias, out, fp8, lora.spare)
        return base, RankActs(u[:, : lora.members * lora.cols], lora.cols)
    if lora is None or lora.spare == 0:
        base = _linear(x, weight, bias, out, fp8)[0]
        if lora is None:
            return base, None
        u = torch.bmm(x.reshape(lora.members, -1, x.shape[-1]), lora.A.mT)
        return base, RankActs(u.view(-1, lora.cols), 0)
    # the GEMM covers the spare rows of the members (rounded to 8 for aligned rows)
    used = -(-lora.members * lora.cols // 8) * 8
    base, u = _linear(x, weight, bias, out, fp8, min(lora.spare, used))
    return base, RankActs(u[:, : lora.members * lora.cols], lora.cols)


def _linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    out: int,
    fp8: Fp8Weight | None = None,
    spare: int = 0,
) -> tuple[Tensor, Tensor]:
    """``(bias + x W^T [rows, out], x S^T [rows, spare])``: W is ``weight``'s first ``out`` rows,
    S the ``spare`` rows after them (LoRA first factors; zero bias). In the model's dtype one
    GEMM gives both; with ``fp8`` W's product is an fp8 GEMM and S's a separate one."""
    if fp8 is not None:
        base = fp8.linear(x, None if bias is None else bias[:out])
        return base, x @ weight[out : out + spare].t() if spare else x.new_empty(x.shape[0], 0)
    w = weight[: out + spare]
    y = x @ w.t() if bias is None else torch.addmm(bias[: out + spare], x, w.t())
    return y[:, :out], y[:, out:]


def _modules(lora: GroupLora) -> Iterator[tuple[int, slice]]:
    """Each module's first rank column in ``u`` (-1: not adapted) and its output columns."""
    col = 0
    for off, width in zip(lora.offsets, lora.splits, strict=True):
        yield off, slice(col, col + width)
        col += width


ROW_CHUNK = 1024  # rows of per-row-member deltas computed at once (bounds the gathered Bt)


DENSE_K = 256  # up to this many member x rank columns, per-row deltas are one masked GEMM


def _row_delta(acts: RankActs, lora: GroupLora) -> Tensor:
    """:func:`lora_delta` where each row names its member (``lora.member``).

    ``u`` holds every member's rank activations; with few members x rank (<= ``DENSE_K``) the
    other members' columns are zeroed and one GEMM per module against all members' stacked
    ``Bt`` gives each row its own member's delta (prefill rows are ~40x faster this way on a
    CPU than one tiny matmul per row). Otherwise Bt is gathered per row, ``ROW_CHUNK`` rows at
    a time."""
    assert lora.member is not None
    rows, member = acts.u.shape[0], lora.member.long()
    if lora.members * lora.rank <= DENSE_K:
        mine = F.one_hot(member, lora.members).bool()[:, :, None]
        u = torch.where(mine, acts.u.unflatten(1, (lora.members, lora.cols)), 0.0)
        parts, col = [], 0
        for off, width in zip(lora.offsets, lora.splits, strict=True):
            if off < 0:
                parts.append(u.new_zeros(rows, width, dtype=lora.Bt.dtype))
            else:
                bt = lora.Bt[:, :, col : col + width].reshape(-1, width)
                parts.append(u[:, :, off : off + lora.rank].reshape(rows, -1).to(bt.dtype) @ bt)
            col += width
        return torch.cat(parts, -1)
    u = acts.u.unflatten(1, (lora.members, lora.cols))[torch.arange(rows), member]
    out = torch.empty(rows, lora.Bt.shape[-1], dtype=lora.Bt.dtype, device=u.device)
    for lo in range(0, rows, ROW_CHUNK):
        hi = min(rows, lo + ROW_CHUNK)
        bt = lora.Bt[member[lo:hi]]
        for off, cols in _modules(lora):
            part = out[lo:hi, cols]
            if off < 0:
                part.zero_()
            else:
                ur = u[lo:hi, None, off : off + lora.rank].to(bt.dtype)
                part.copy_(torch.bmm(ur, bt[:, :, cols])[:, 0])
    return out


def _run_delta(acts: RankActs, lora: GroupLora) -> Tensor:
    """:func:`lora_delta` for rows in member runs (``lora.runs``; ``u`` is each row's own)."""
    assert lora.runs is not None
    out = acts.u.new_zeros(acts.u.shape[0], lora.Bt.shape[-1], dtype=lora.Bt.dtype)
    for m, lo, hi in lora.runs:
        for off, cols in _modules(lora):
            if off >= 0:
                u = acts.u[lo:hi, off : off + lora.rank].to(lora.Bt.dtype)
                torch.mm(u, lora.Bt[m, :, cols], out=out[lo:hi, cols])
    return out


def lora_delta(acts: RankActs, lora: GroupLora) -> Tensor:
    """``[rows, out]``: every module's ``u_j Bt_j`` in its output columns (eager)."""
    if lora.runs is not None and acts.member_stride == 0:
        return _run_delta(acts, lora)
    if lora.member is not None:
        return _row_delta(acts, lora)
    u = acts.per_member(lora.members, lora.cols)
    parts, lo = [], 0
    for off, width in zip(lora.offsets, lora.splits, strict=True):
        bt = lora.Bt[:, :, lo : lo + width]
        if off < 0:
            parts.append(u.new_zeros(*u.shape[:2], width))
        else:
            parts.append(torch.bmm(u[:, :, off : off + lora.rank].to(bt.dtype), bt))
        lo += width
    delta = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
    return delta.view(-1, delta.shape[-1])


SpareRows = Callable[[int, str, int], Tensor]
"""``(layer, group, rows) -> [rows, in]``: spare rows of that projection's weight buffer."""


class FastLora:
    """Static grouped adapter buffers for ``members`` members of ``layout``.

    Args:
        layout: where the adapters go.
        members: M, the population (chunk) size the buffers hold.
        in_features: each group's input width (``{"qkv": hidden, ...}``).
        out_splits: each group's fused output widths per module (``{"qkv": (q, kv, kv), ...}``).
        pad_to: the rank columns of a group, ``k * r``, are padded with zeros to a multiple of
            this, so the matrices are 16-byte aligned and cuBLAS picks its fast kernels.
        spare_rows: where ``A`` goes in the weight buffers (None: own buffers, ``u`` by bmm);
            then ``c = k * r`` and the GEMM covers ``spare`` rows, a multiple of 8.
    """

    def __init__(
        self,
        layout: LoraLayout,
        members: int,
        in_features: dict[str, int],
        out_splits: dict[str, tuple[int, ...]],
        device: torch.device,
        dtype: torch.dtype,
        pad_to: int = 8,
        spare_rows: SpareRows | None = None,
    ) -> None:
        self.layout, self.members = layout, members
        r = layout.rank
        slots: dict[tuple[int, str], list[str]] = {}
        for t in layout.targets:
            slots.setdefault((t.layer, GROUP_OF[t.module]), []).append(t.module)
        self.groups: dict[tuple[int, str], GroupLora] = {}
        for (layer, group), modules in slots.items():
            need = len(modules) * r
            splits = out_splits[group]
            offsets = tuple(modules.index(m) * r if m in modules else -1 for m in GROUPS[group])
            bt = torch.zeros(members, r, sum(splits), device=device, dtype=dtype)
            if spare_rows is None:
                cols = -(-need // pad_to) * pad_to
                a = torch.zeros(members, cols, in_features[group], device=device, dtype=dtype)
                spare = 0
            else:
                spare = -(-members * need // 8) * 8
                a = spare_rows(layer, group, spare)[: members * need].view(members, need, -1)
            self.groups[(layer, group)] = GroupLora(a, bt, offsets, splits, spare)
        # per group, which layout targets fill its A's rank columns (in order) and its Bt's
        # output columns (in GROUPS order; None: a module not adapted, its columns stay 0)
        index = {(t.layer, t.module): k for k, t in enumerate(layout.targets)}
        self._fill: list[tuple[GroupLora, list[int], list[int | None]]] = []
        for (layer, group), modules in slots.items():
            a_from = [index[(layer, m)] for m in modules]
            b_from = [index.get((layer, m)) for m in GROUPS[group]]
            self._fill.append((self.groups[(layer, group)], a_from, b_from))
        self._zeros: dict[tuple[int, ...], Tensor] = {}

    def load(self, population: LoraPopulation) -> None:
        """Copy ``population`` (M members, any device / dtype) into the buffers, in place.

        One ``cat`` into each group's A and Bt and one foreach scaling, not two strided copies
        per target: issued one by one from Python those cost 5-6 ms on an H200 (1% of the
        0.5B shape's generation)."""
        if len(population) != self.members:
            raise ValueError(f"{len(population)} members for buffers of {self.members}")
        if not self.groups:
            return
        factors = list(population.factors())
        dev = next(iter(self.groups.values())).Bt.device

        def here(t: Tensor) -> Tensor:
            return t if t.device == dev else t.to(dev, non_blocking=True)

        for buf, a_from, b_from in self._fill:
            torch.cat(
                [here(factors[k][1]) for k in a_from], 1, out=buf.A[:, : len(a_from) * buf.rank]
            )
            parts = []
            for k, width in zip(b_from, buf.splits, strict=True):
                parts.append(self._zero(buf, width) if k is None else here(factors[k][2]).mT)
            torch.cat(parts, 2, out=buf.Bt)
        torch._foreach_mul_([buf.Bt for buf in self.groups.values()], population.scaling)

    def _zero(self, buf: GroupLora, width: int) -> Tensor:
        """Zeros for a module that is not adapted (its Bt columns)."""
        key = (buf.members, buf.rank, width)
        if key not in self._zeros:
            self._zeros[key] = buf.Bt.new_zeros(key)
        return self._zeros[key]

    def get(self, layer: int, group: str) -> GroupLora | None:
        return self.groups.get((layer, group))

    def rows(self, member: Tensor) -> FastLoraRows:
        """Rows of any members in any order: row ``i`` is member ``member[i]``."""
        return FastLoraRows(self, member)

    def runs(self, member: Tensor, runs: tuple[tuple[int, int, int], ...]) -> FastLoraRows:
        """Rows grouped by member: ``runs`` of ``(member, first row, end row)`` (and ``member``
        per row, for the kernels that take it)."""
        return FastLoraRows(self, member, runs)

    def nbytes(self) -> int:
        """Bytes of the buffers this object owns (``A`` in weight buffers not counted)."""
        own = [g.Bt for g in self.groups.values()]
        own += [g.A for g in self.groups.values() if g.spare == 0]
        return sum(t.nbytes for t in own)


class FastLoraRows:
    """A :class:`FastLora` for rows that each name their member (continuous batching)."""

    def __init__(
        self,
        lora: FastLora,
        member: Tensor,
        runs: tuple[tuple[int, int, int], ...] | None = None,
    ) -> None:
        self.lora, self.member, self.runs = lora, member, runs
        # the fused kernels' tiles of one member, found once for every layer (GPU only)
        self.tiles = tile_members(member) if member.is_cuda and member.numel() else None
        self._groups: dict[tuple[int, str], GroupLora | None] = {}

    def get(self, layer: int, group: str) -> GroupLora | None:
        key = (layer, group)
        if key not in self._groups:
            g = self.lora.get(layer, group)
            self._groups[key] = (
                None
                if g is None
                else replace(g, member=self.member, runs=self.runs, tiles=self.tiles)
            )
        return self._groups[key]
