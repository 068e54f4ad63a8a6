"""Per-row fp8 quantization of a GEMM's input (``server.quantization=fp8``), one kernel.

One program per row: a pass for the row's ``amax``, then a pass writing
``x / (amax / 448)`` as fp8 e4m3 (the row is re-read from L2). The values of
:func:`evolm.engine.fast.fp8._quantize_torch` without its five passes over the tensor, up to
the GPU's division (not IEEE-exact: on an H200 one byte in ~4 million rounds the other way).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from evolm.engine.kernels import FP8, FP8_MAX, TINY


@triton.jit
def _quantize_rows_kernel(
    x_ptr, q_ptr, s_ptr, n, sx, sq, tiny, fmax, BLOCK: tl.constexpr
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    amax = tl.zeros([BLOCK], dtype=tl.float32)
    for lo in range(0, n, BLOCK):
        ok = lo + cols < n
        x = tl.load(x_ptr + row * sx + lo + cols, mask=ok, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(amax, axis=0), tiny) / fmax
    tl.store(s_ptr + row, scale)
    for lo in range(0, n, BLOCK):
        ok = lo + cols < n
        x = tl.load(x_ptr + row * sx + lo + cols, mask=ok, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(x / scale, -fmax), fmax)
        tl.store(q_ptr + row * sq + lo + cols, q.to(q_ptr.dtype.element_ty), mask=ok)


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """``(x_q [rows, n] fp8, scale [rows, 1] fp32)``, ``x ~= x_q * scale`` per row; ``x``'s
    rows may be strided (last dim contiguous)."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"rows must be 2-D with contiguous columns, got strides {x.stride()}")
    rows, n = x.shape
    q = torch.empty(rows, n, dtype=FP8, device=x.device)
    scale = torch.empty(rows, 1, dtype=torch.float32, device=x.device)
    block = min(4096, triton.next_power_of_2(n))
    _quantize_rows_kernel[(rows,)](
        x, q, scale, n, x.stride(0), q.stride(0), TINY, FP8_MAX,
        BLOCK=block, num_warps=max(1, min(8, block // 512)),
    )  # fmt: skip
    return q, scale
