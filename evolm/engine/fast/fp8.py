"""fp8 (e4m3) projections: ``server.quantization=fp8``, W8A8 with dynamic scales.

Each fused projection's weight ``W [out, in]`` gets an fp8 copy with one scale per output
channel (``amax / 448``), made once when the engine is built. Every call quantizes its input
rows with one scale per row (per token, from that row's ``amax``) and multiplies with
``torch._scaled_mm``: ``y = (x_q W_q^T) * s_x * s_w`` in fp32, rounded to the model's dtype (a
bias, q/k/v's in Qwen2, is added after that).
On Hopper GPUs the fp8 tensor cores' peak is twice bf16's (measured: 1.4-1.5x on the 7B
shape's large GEMMs), which is what the GEMM-bound shapes (7B decode, prefill) are limited by.

What stays in the model's dtype: the LoRA factors and products (the ES perturbations are far
smaller than fp8's resolution, so ``u = x A^T`` is a separate bf16 GEMM over the spare rows:
:func:`evolm.engine.fast.lora.project`), the embedding, norms, attention and the LM head.

The fp8 copy is made from the weights at build time: in-place edits of the base weights after
that (which evolm's ES never makes: it moves LoRA adapters) are not seen by the fp8 path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
from torch import Tensor

from evolm.engine.kernels import FP8, FP8_MAX, TINY

log = logging.getLogger(__name__)


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """``(x_q [rows, n] fp8, scale [rows, 1] fp32)`` with ``x ~= x_q * scale`` row by row.

    On CUDA one Triton pass (:func:`evolm.engine.kernels.quant.quantize_rows`); elsewhere (or
    without Triton) torch ops computing the same values."""
    kernel = _kernel() if x.is_cuda else None
    return _quantize_torch(x, dim=1) if kernel is None else kernel(x)


@cache
def _kernel() -> Callable[[Tensor], tuple[Tensor, Tensor]] | None:
    try:
        from evolm.engine.kernels.quant import quantize_rows as kernel
    except ImportError as e:
        log.warning("fp8 row quantizer: no Triton (%s); torch ops, five passes", e)
        return None
    return kernel


def _quantize_torch(x: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    """Scales along ``dim`` (1: per row, keepdim) and the saturated fp8 values."""
    amax = x.abs().amax(dim=dim, keepdim=True).float().clamp_min(TINY)
    scale = amax / FP8_MAX
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def fp8_shape_problem(model: Any) -> str | None:
    """Why a :class:`~evolm.engine.fast.model.FastModel`'s projections cannot run as fp8 GEMMs
    on a GPU (``torch._scaled_mm`` needs every inner and output size a multiple of 16)."""
    sizes = {
        "hidden_size": model.hidden,
        "intermediate_size": model.inter,
        "q/k/v output": model.q_out + 2 * model.kv_out,
    }
    odd = {name: n for name, n in sizes.items() if n % 16}
    if not odd:
        return None
    return f"fp8 GEMMs need sizes that are multiples of 16; this model has {odd}"


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
        # the bias in the GEMM's epilogue: no second pass over the output, one rounding
        return torch._scaled_mm(
            xq, self.weight.t(), scale_a=sx, scale_b=self.scale, bias=bias, out_dtype=x.dtype
        )
