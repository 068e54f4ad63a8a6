"""Seed -> noise: every member's perturbation is rebuilt from integers, never stored.

Definition: the noise of the member with ``seed`` is ONE standard normal fp32 vector
``randn(total)`` drawn by a generator seeded with ``mix_seed(seed)``, where ``total`` is the
number of elements of all ES tensors together. Tensor ``t`` gets the ``t``-th contiguous segment
of that vector (offsets: the cumulative ``numel`` of the tensors before it, in order), viewed to
its shape.

Why tensors are independent: the segments are disjoint stretches of one pseudo-random stream
(Mersenne Twister on CPU, Philox on CUDA), so no draw is reused and the tensors of a member get
independent noise. (The reference code reseeded the generator with the same seed for every
tensor, so all tensors of a member started from the same draws: identical, not independent,
noise.) Drawing a member in one call costs one generator seeding per member instead of one per
(member, tensor).

Noise depends on the device type that draws it and on the tensor shapes (their total size): the
same ``(seed, shapes)`` gives the same noise on the same kind of device only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_DOMAIN = 0x65766F6C6D5F6573  # "evolm_es": separates these seeds from plain splitmix64

Shape = Sequence[int] | torch.Size


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
    """A fresh generator for ``device``, meant to be reseeded by :func:`fill_member_noise`."""
    return torch.Generator(device=torch.device(device))


def fill_member_noise(out_flat: Tensor, seed: int, generator: torch.Generator) -> Tensor:
    """Fill the 1-D contiguous fp32 ``out_flat`` (``total`` elements) with ``seed``'s noise.

    ``generator`` must live on ``out_flat``'s device; it is reseeded, so any reusable one will do.
    """
    generator.manual_seed(mix_seed(seed))
    return out_flat.normal_(generator=generator)


def split_noise(flat: Tensor, shapes: Sequence[Shape]) -> list[Tensor]:
    """Views of the last dimension of ``flat``, segment ``t`` viewed to ``shapes[t]``.

    ``flat`` is ``[total]`` (one member) or ``[K, total]`` (K members, giving ``[K, *shape]``).
    """
    sizes = [math.prod(s) for s in shapes]
    lead = flat.shape[:-1]
    segments = flat.split(sizes, dim=-1)
    return [x.view(*lead, *s) for x, s in zip(segments, shapes, strict=True)]


def member_noise(
    seed: int,
    shapes: Sequence[Shape],
    *,
    device: torch.device | str,
    generator: torch.Generator | None = None,
) -> list[Tensor]:
    """Standard normal fp32 noise of the member with ``seed``, one tensor per shape.

    The tensors are views into one flat vector of ``sum(numel)`` elements. The same
    ``(seed, shapes, device type)`` always gives the same noise; pass ``generator`` (on
    ``device``) to reuse one generator across calls instead of creating one per call.
    """
    total = sum(math.prod(s) for s in shapes)
    flat = torch.empty(total, dtype=torch.float32, device=device)
    fill_member_noise(flat, seed, generator or new_generator(device))
    return split_noise(flat, shapes)
