"""Fitness shaping: raw fitness per member -> weights for the update. Higher fitness is better.

Both shapings rank every non-finite fitness (NaN, +inf, -inf) worst: a member whose evaluation
failed, or whose task returned an infinite reward (a bug, not a great answer), must not pull the
mean towards itself. Results are float64 on the input's device.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def zscore(f: Tensor) -> Tensor:
    """``(f - mean) / (std + 1e-8)`` with the population std (``unbiased=False``), as the paper.

    Non-finite values (NaN, +inf, -inf) are first replaced by the lowest finite fitness
    (worst). All non-finite, or all equal, gives zeros.
    """
    f = f.detach().to(torch.float64).flatten()
    finite = torch.isfinite(f)
    if not bool(finite.any()):
        return torch.zeros_like(f)
    f = torch.where(finite, f, f[finite].min())
    return (f - f.mean()) / (f.std(unbiased=False) + 1e-8)


def centered_ranks(f: Tensor) -> Tensor:
    """Ranks mapped linearly onto ``[-0.5, 0.5]`` (OpenAI-ES): best gets 0.5, worst -0.5.

    Non-finite values (NaN, +inf, -inf) get the lowest ranks. Ties get distinct ranks in order
    of position (stable sort).
    """
    f = f.detach().to(torch.float64).flatten()
    n = f.numel()
    if n < 2:
        return torch.zeros_like(f)
    f = torch.where(torch.isfinite(f), f, -torch.inf)
    order = torch.sort(f, stable=True).indices
    ranks = torch.empty_like(f)
    ranks[order] = torch.arange(n, dtype=torch.float64, device=f.device)
    return ranks / (n - 1) - 0.5


SHAPINGS: dict[str, Callable[[Tensor], Tensor]] = {
    "zscore": zscore,
    "centered_ranks": centered_ranks,
}
