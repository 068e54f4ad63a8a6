"""Optimizers that ASCEND: they move the mean along an ascent direction (ES maximises fitness).

State is a plain dict of ints and lists of tensors shaped like the mean, so it survives
``torch.save``/``torch.load(weights_only=True)``. Nothing here mutates its inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

OPTIMIZERS = ("sgd", "adam")

OptState = dict[str, Any]
"""``{}`` for sgd; ``{"step": int, "m": list[Tensor], "v": list[Tensor]}`` for adam."""


def init_opt_state(name: str, mean: Sequence[Tensor]) -> OptState:
    """Empty optimizer state for ``mean``: ``{}`` for sgd; ``step``, ``m``, ``v`` for adam."""
    if name == "sgd":
        return {}
    if name == "adam":
        return {
            "step": 0,
            "m": [torch.zeros_like(x) for x in mean],
            "v": [torch.zeros_like(x) for x in mean],
        }
    raise ValueError(f"unknown optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}")


def ascend(
    name: str,
    mean: Sequence[Tensor],
    direction: Sequence[Tensor],
    opt: OptState,
    *,
    lr: float,
    weight_decay: float = 0.0,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
) -> tuple[list[Tensor], OptState]:
    """One optimizer step up ``direction``; returns the new mean and the new optimizer state.

    Weight decay is decoupled (AdamW style): ``mean <- mean * (1 - lr * weight_decay)`` before
    the step. sgd: ``mean += lr * direction``. adam: ``mean += lr * m_hat / (sqrt(v_hat) + eps)``
    with bias-corrected moments of ``direction``.
    """
    decay = 1.0 - lr * weight_decay
    if name == "sgd":
        steps, new_opt = list(direction), {}
    elif name == "adam":
        steps, new_opt = _adam_steps(direction, opt, beta1=beta1, beta2=beta2, eps=eps)
    else:
        raise ValueError(f"unknown optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}")
    # torch._foreach_*: one fused launch per chunk of tensors, not one per tensor (as in
    # torch.optim): hundreds of small LoRA tensors would otherwise be launch bound on a GPU
    new_mean = torch._foreach_mul(list(mean), decay) if decay != 1.0 else [x.clone() for x in mean]
    torch._foreach_add_(new_mean, steps, alpha=lr)
    return new_mean, new_opt


def _adam_steps(
    direction: Sequence[Tensor], opt: OptState, *, beta1: float, beta2: float, eps: float
) -> tuple[list[Tensor], OptState]:
    """Adam's bias-corrected step per tensor, and the advanced moments."""
    step = int(opt["step"]) + 1
    g = list(direction)
    m = torch._foreach_mul(opt["m"], beta1)
    torch._foreach_add_(m, g, alpha=1.0 - beta1)
    v = torch._foreach_mul(opt["v"], beta2)
    torch._foreach_addcmul_(v, g, g, value=1.0 - beta2)
    c1, c2 = 1.0 - beta1**step, 1.0 - beta2**step
    denom = torch._foreach_div(v, c2)
    torch._foreach_sqrt_(denom)
    torch._foreach_add_(denom, eps)
    steps = torch._foreach_div(m, c1)
    torch._foreach_div_(steps, denom)
    return steps, {"step": step, "m": m, "v": v}
