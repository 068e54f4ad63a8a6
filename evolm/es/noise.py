"""Seed -> noise: every member's perturbation is rebuilt from integers, never stored.

The noise of tensor ``index`` for the member with ``seed`` comes from a generator seeded with
``mix_seed(seed, index)``, so each tensor of a member gets independent noise (the reference code
reused one seed for every tensor, which correlates the noise across tensors).

Noise depends on the device type that draws it (CPU uses Mersenne Twister, CUDA uses Philox):
the same ``(seed, index)`` gives the same tensor on the same kind of device only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_DOMAIN = 0x65766F6C6D5F6573  # "evolm_es": separates these seeds from plain splitmix64


def _splitmix64(x: int) -> int:
    """One splitmix64 step: a bijective, well-mixing map of 64-bit integers."""
    x = (x + _GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def mix_seed(*ints: int) -> int:
    """Mix integers into one seed in ``[0, 2**63)``, deterministically across runs and machines.

    Each input is reduced modulo ``2**64`` (so negative ints are allowed); the number of inputs
    and their order matter: ``mix_seed(1, 2) != mix_seed(2, 1) != mix_seed(1, 2, 0)``.
    Python's ``hash()`` is not used, so the result does not depend on ``PYTHONHASHSEED``.
    """
    h = _splitmix64(_DOMAIN ^ len(ints))
    for x in ints:
        h = _splitmix64(h ^ (int(x) & _MASK64))
    return h >> 1


def new_generator(device: torch.device | str) -> torch.Generator:
    """A fresh generator for ``device``, meant to be reseeded by :func:`fill_noise`."""
    return torch.Generator(device=torch.device(device))


def fill_noise(out: Tensor, seed: int, index: int, generator: torch.Generator) -> Tensor:
    """Fill ``out`` in place with the standard normal noise of tensor ``index`` of ``seed``.

    ``generator`` must live on ``out``'s device; it is reseeded, so any reusable one will do.
    """
    generator.manual_seed(mix_seed(seed, index))
    return out.normal_(generator=generator)


def member_noise(
    seed: int,
    index: int,
    shape: Sequence[int] | torch.Size,
    *,
    device: torch.device | str,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Standard normal fp32 noise for tensor ``index`` of the member with ``seed``.

    The same ``(seed, index, shape, device)`` always gives the same tensor; pass ``generator``
    (on ``device``) to reuse one generator across calls instead of creating one per call.
    """
    out = torch.empty(tuple(shape), dtype=torch.float32, device=device)
    return fill_noise(out, seed, index, generator or new_generator(device))
