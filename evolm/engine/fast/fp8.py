"""fp8 (e4m3) projections: ``server.quantization=fp8``, W8A8 with dynamic scales.

Each fused projection's weight ``W [out, in]`` gets an fp8 copy with one scale per output
channel (``amax / 448``), made once when the engine is built. Every call quantizes its input
rows with one scale per row (per token, from that row's ``amax``) and multiplies with
``torch._scaled_mm``: ``y = (x_q W_q^T) * s_x * s_w`` in fp32, rounded once to the model's dtype.
On Hopper GPUs the fp8 tensor cores run about twice the bf16 rate, which is what the GEMM-bound
shapes (7B decode, every prefill) are limited by.

What stays in the model's dtype: the LoRA factors and products (the ES perturbations are far
smaller than fp8's resolution, so ``u = x A^T`` is a separate bf16 GEMM over the spare rows:
:func:`evolm.engine.fast.lora.project`), the embedding, norms, attention and the LM head.

The fp8 copy is made from the weights at build time: in-place edits of the base weights after
that (which evolm's ES never makes: it moves LoRA adapters) are not seen by the fp8 path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3's largest finite value
TINY = 1e-12  # an all-zero row or channel gets this amax (its scale never divides by zero)


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """``(x_q [rows, n] fp8, scale [rows, 1] fp32)`` with ``x ~= x_q * scale`` row by row.

    On CUDA one Triton pass (:func:`evolm.engine.kernels.quant.quantize_rows`); elsewhere torch
    ops computing the same values."""
    if x.is_cuda:
        try:
            from evolm.engine.kernels.quant import quantize_rows as kernel
        except ImportError:  # no Triton: the torch ops below
            pass
        else:
            return kernel(x)
    return _quantize_torch(x, dim=1)


def _quantize_torch(x: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    """Scales along ``dim`` (1: per row, keepdim) and the saturated fp8 values."""
    amax = x.abs().amax(dim=dim, keepdim=True).float().clamp_min(TINY)
    scale = amax / FP8_MAX
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


@dataclass(frozen=True)
class Fp8Weight:
    """``weight [out, in]`` fp8 and ``scale [1, out]`` fp32: ``W ~= weight * scale.T``."""

    weight: Tensor
    scale: Tensor

    @classmethod
    def quantize(cls, w: Tensor) -> Fp8Weight:
        """Per-output-channel fp8 copy of ``w [out, in]`` (``w`` is not changed)."""
        q, scale = _quantize_torch(w, dim=1)
        return cls(q, scale.view(1, -1).contiguous())

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes + self.scale.nbytes

    def linear(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        """``bias + x W^T`` for ``x [rows, in]``, in ``x``'s dtype."""
        xq, sx = quantize_rows(x)
        y = torch._scaled_mm(xq, self.weight.t(), scale_a=sx, scale_b=self.scale, out_dtype=x.dtype)
        return y if bias is None else y.add_(bias)
