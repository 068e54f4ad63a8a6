"""Elementwise pieces of the fast forward (and decode attention), eager or fused.

Eagerly, RoPE is five kernels (two slices + cat, two products, a sum) and SiLU-and-multiply two,
each a full pass over its tensor; on a GPU a decode step is short enough that these launches and
passes show. :class:`Ops` holds the eager functions, ``torch.compile``'d ones (compiled at the
first call, which the CUDA-graph warm-up makes before any capture; eager if compiling fails), or
the hand-written Triton kernels of :mod:`evolm.engine.kernels.fused` (the default on GPUs: on an
H100 the compiled kernels ran at about half of HBM bandwidth, cuDNN's decode attention too).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

log = logging.getLogger(__name__)


def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """HF's rotary embedding: ``x cos + rotate_half(x) sin``."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def silu_mul(gate_up: Tensor) -> Tensor:
    """``silu(gate) * up`` for the fused ``[..., 2 * inter]`` gate/up output."""
    inter = gate_up.shape[-1] // 2
    return F.silu(gate_up[..., :inter]) * gate_up[..., inter:]


class _Fallback:
    """A compiled function that falls back to its eager version if compiling fails."""

    def __init__(self, fn: Callable[..., Tensor]) -> None:
        self.eager = fn
        self.compiled: Callable[..., Any] | None = torch.compile(fn, dynamic=None, fullgraph=True)

    def __call__(self, *args: Tensor) -> Tensor:
        if self.compiled is not None:
            try:
                return self.compiled(*args)
            except Exception as e:  # an inductor or Triton failure must not stop generation
                log.warning("torch.compile of %s failed (%s); eager", self.eager.__name__, e)
                self.compiled = None
        return self.eager(*args)


def default_mode(device: torch.device) -> str:
    """``triton`` on CUDA when Triton imports, else ``eager``."""
    if device.type != "cuda":
        return "eager"
    try:
        import evolm.engine.kernels.fused  # noqa: F401
    except ImportError:
        return "eager"
    return "triton"


class Ops:
    """The elementwise ops (and decode attention) the forward calls.

    ``mode``: ``eager`` (plain torch), ``compile`` (torch.compile'd RoPE and SiLU-and-multiply)
    or ``triton`` (:mod:`evolm.engine.kernels.fused`, GPU only): there decode attention is a Triton
    kernel too (``decode_attention`` is None where the forward should use SDPA), so are the
    residual add + RMSNorm (``add_rms_norm``), and the second LoRA products are fused into
    them and into the RoPE and SiLU-and-multiply kernels.
    """

    MODES = ("eager", "compile", "triton")

    def __init__(self, mode: str) -> None:
        if mode not in self.MODES:
            raise ValueError(f"unknown ops mode {mode!r}; choose from {self.MODES}")
        self.mode = mode
        self.rope: Callable[[Tensor, Tensor, Tensor], Tensor] = rope
        self.silu_mul: Callable[..., Tensor] = silu_mul
        self.decode_attention: Callable[[Tensor, Tensor, Tensor, Tensor], Tensor] | None = None
        self.slot_attention: Callable[..., Tensor] | None = None  # continuous batching's
        self.qkv_rope: Callable[..., Tensor] | None = None
        self.add_rms_norm: Callable[..., Tensor] | None = None
        self.norm_max_hidden = 0
        if mode == "compile":
            self.rope, self.silu_mul = _Fallback(rope), _Fallback(silu_mul)
        elif mode == "triton":
            from evolm.engine.kernels import attention, fused

            self.silu_mul, self.qkv_rope = fused.silu_mul, fused.qkv_rope
            self.add_rms_norm = fused.add_rms_norm
            self.norm_max_hidden = fused.NORM_MAX_HIDDEN
            self.decode_attention = attention.decode_attention
            self.slot_attention = attention.slot_attention
