"""Triton kernels of the fast path: the only package that needs ``triton``.

The kernels take raw tensors; a fused LoRA's second product comes as a :class:`LoraOperand`
(defined here, so that callers can build one without importing Triton).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

FP8 = torch.float8_e4m3fn  # fp8 e4m3: the fp8 KV cache's and the fp8 GEMMs' format
FP8_MAX = 448.0  # e4m3's largest finite value
TINY = 1e-12  # an all-zero row or channel gets this amax (its scale never divides by zero)


class LoraOperand(NamedTuple):
    """The second LoRA product a kernel adds to its input, for every row.

    Row ``i`` of member ``m = i // (rows / M)`` (or ``m = member[i]`` where ``member`` is
    given: continuous batching, rows of any member in any order) adds, for module ``j``,
    ``u[i, m * u_member_stride + offsets[j] :][:rank] @ bt[m, :, module j's columns]``.

    - ``u [rows, ...]``: rank-space activations (``u_member_stride`` 0: each row's own
      ``[rows, c]``; else all members' columns side by side, as the base GEMM writes them);
    - ``bt [M, rank, out]``: every member's ``B^T`` pre-multiplied by the LoRA scaling;
    - ``offsets``: each module's first rank column in ``u`` (-1: not adapted, its ``bt``
      columns are zero);
    - ``member [rows]`` (int32 or int64, optional): each row's member;
    - ``tiles [ceil(rows / TILE_ROWS)]`` (optional, with ``member``): per tile of
      :data:`TILE_ROWS` rows, their one member, or -1 where they name several
      (:func:`tile_members`).
    """

    u: Tensor
    u_member_stride: int
    bt: Tensor
    offsets: tuple[int, ...]
    member: Tensor | None = None
    tiles: Tensor | None = None


TILE_ROWS = 16  # rows per program of the fused kernels where rows name their members


def tile_members(member: Tensor) -> Tensor:
    """Per tile of :data:`TILE_ROWS` rows of ``member``: their one member, or -1. Computed once
    per decode step (or prefill chunk) for every layer's kernels, so a tile of one member (the
    slot scheduler sorts its batches by member) skips finding it row by row."""
    pad = -member.shape[0] % TILE_ROWS
    full = torch.cat([member, member[-1:].expand(pad)]) if pad else member
    tiles = full.reshape(-1, TILE_ROWS)
    lo, hi = tiles.amin(1), tiles.amax(1)
    return torch.where(lo == hi, lo, -1)
