"""Grouped multi-LoRA for the fast path: one pair of batched matmuls per FUSED projection.

The fast forward (:mod:`evolm.server.fastpath`) runs q/k/v as one matmul and gate/up as one. Their
adapters are grouped the same way: for a group of ``k`` adapted modules, ``A`` holds the k A's
side by side, ``[M, c, in]`` (``c >= k*r`` rank columns, zero-padded), and ``Bt`` is the
block-structured transpose ``[M, c, out_total]``: module j's ``B_j^T`` (pre-multiplied by
``alpha / r``) sits in its rank rows and output columns, every other entry is zero. So
``(x A^T) Bt`` is exactly each module's own delta, in two ``bmm`` for the whole group and every
member at once (or with the second product fused into the consumer's kernel, see
:mod:`evolm.server.triton_ops`). The buffers are static: :meth:`FastLora.load`
copies a new population into them in place, so CUDA graphs captured over them stay valid.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch
from torch import Tensor

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
    """One fused projection's adapters for M members: ``A [M, c, in]``, ``Bt [M, c, out]``."""

    A: Tensor
    Bt: Tensor

    def members(self, lo: int, hi: int) -> GroupLora:
        return GroupLora(self.A[lo:hi], self.Bt[lo:hi])


def lora_parts(
    x: Tensor, weight: Tensor, bias: Tensor | None, lora: GroupLora
) -> tuple[Tensor, Tensor]:
    """``(bias + x W^T, x A_m^T)``: the base output and the rank-space activations ``[rows, c]``,
    for a consumer kernel that applies ``Bt`` itself."""
    base = x @ weight.t() if bias is None else torch.addmm(bias, x, weight.t())
    u = torch.bmm(x.reshape(lora.A.shape[0], -1, x.shape[-1]), lora.A.mT)
    return base, u.view(-1, u.shape[-1])


def lora_linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    lora: GroupLora | None = None,
    residual: Tensor | None = None,
) -> Tensor:
    """``residual + bias + x W^T + (x A_m^T) B_m^T`` with rows grouped by member ``m``.

    ``x`` is ``[rows, in]`` (rows = M * rows-per-member, member-major). The residual (or bias) is
    the accumulator of the first matmul and the base matmul accumulates in place (``beta=1``),
    so neither costs an extra pass over the output.
    """
    acc = residual if bias is None else (bias if residual is None else residual + bias)
    if lora is None:
        return x @ weight.t() if acc is None else torch.addmm(acc, x, weight.t())
    members, out = lora.A.shape[0], weight.shape[0]
    u = torch.bmm(x.reshape(members, -1, x.shape[-1]), lora.A.mT)  # [M, t, k*r]
    if acc is None:
        y = torch.bmm(u, lora.Bt)
    else:
        acc = acc.view(members, -1, out) if acc.dim() == 2 else acc
        y = torch.baddbmm(acc, u, lora.Bt)
    return y.view(-1, out).addmm_(x, weight.t())


class FastLora:
    """Static grouped adapter buffers for ``members`` members of ``layout``.

    Args:
        layout: where the adapters go.
        members: M, the population (chunk) size the buffers hold.
        in_features: each group's input width (``{"qkv": hidden, ...}``).
        out_splits: each group's fused output widths per module (``{"qkv": (q, kv, kv), ...}``).
        pad_to: the rank columns of a group, ``k * r``, are padded with zeros to a multiple of
            this, so the matrices are 16-byte aligned and cuBLAS picks its fast kernels.
        pow2_groups: groups padded to a power of two >= ``pad_to`` instead (the ones whose
            second product a Triton kernel applies).
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
        pow2_groups: Collection[str] = (),
    ) -> None:
        self.layout, self.members = layout, members
        r = layout.rank
        slots: dict[tuple[int, str], list[str]] = {}
        for t in layout.targets:
            slots.setdefault((t.layer, GROUP_OF[t.module]), []).append(t.module)
        self.groups: dict[tuple[int, str], GroupLora] = {}
        for (layer, group), modules in slots.items():
            cols = _columns(len(modules) * r, pad_to, group in pow2_groups)
            out = sum(out_splits[group])
            self.groups[(layer, group)] = GroupLora(
                torch.zeros(members, cols, in_features[group], device=device, dtype=dtype),
                torch.zeros(members, cols, out, device=device, dtype=dtype),
            )
        # where each layout tensor goes: (group buffer, rank columns, output rows)
        self._plan: list[tuple[GroupLora, slice, slice]] = []
        for t in layout.targets:
            group = GROUP_OF[t.module]
            j = slots[(t.layer, group)].index(t.module)
            pos = GROUPS[group].index(t.module)
            off = sum(out_splits[group][:pos])
            rows = slice(off, off + out_splits[group][pos])
            self._plan.append((self.groups[(t.layer, group)], slice(j * r, (j + 1) * r), rows))

    def load(self, population: LoraPopulation) -> None:
        """Copy ``population`` (M members, any device / dtype) into the buffers, in place."""
        if len(population) != self.members:
            raise ValueError(f"{len(population)} members for buffers of {self.members}")
        for k, (buf, cols, rows) in enumerate(self._plan):
            buf.A[:, cols].copy_(population.tensors[2 * k], non_blocking=True)
            buf.Bt[:, cols, rows].copy_(population.tensors[2 * k + 1].mT, non_blocking=True)
        for buf in self.groups.values():
            buf.Bt.mul_(self.layout.scaling)

    def get(self, layer: int, group: str) -> GroupLora | None:
        return self.groups.get((layer, group))

    def view(self, lo: int, hi: int) -> FastLoraView:
        """Members ``lo:hi`` (for prefill chunks), sharing the buffers."""
        return FastLoraView(self, lo, hi)

    def nbytes(self) -> int:
        return sum(g.A.nbytes + g.Bt.nbytes for g in self.groups.values())


def _columns(needed: int, pad_to: int, pow2: bool) -> int:
    if pow2:
        return max(16, 1 << (needed - 1).bit_length())
    return -(-needed // pad_to) * pad_to


class FastLoraView:
    """A member range of a :class:`FastLora`; same ``get`` interface."""

    def __init__(self, lora: FastLora, lo: int, hi: int) -> None:
        self.lora, self.lo, self.hi = lora, lo, hi

    def get(self, layer: int, group: str) -> GroupLora | None:
        g = self.lora.get(layer, group)
        return None if g is None else g.members(self.lo, self.hi)
