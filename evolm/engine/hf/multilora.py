"""A linear layer that applies a different LoRA adapter to each group of batch rows.

Rows are grouped by member: a batch of ``M * R`` rows holds member 0's R rows, then member 1's.
Each member's delta ``scaling * (x @ A_m^T) @ B_m^T`` is two batched matmuls over all members at
once: no loop over members, no adapter swap.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from evolm.lora.layout import LoraLayout, LoraPopulation


class MultiLoraLinear(nn.Module):
    """Wraps a base ``nn.Linear``; ``A``/``B`` are ``[M, r, in]`` and ``[M, out, r]`` or None."""

    def __init__(self, base: nn.Linear, scaling: float) -> None:
        super().__init__()
        self.base = base
        self.scaling = scaling
        self.A: torch.Tensor | None = None
        self.B: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self.A is None or self.B is None:
            return y
        members = self.A.shape[0]
        xs = x.reshape(members, -1, x.shape[-1])  # [M, rows*tokens, in]
        delta = torch.bmm(torch.bmm(xs, self.A.mT), self.B.mT)  # [M, rows*tokens, out]
        return y + (self.scaling * delta).reshape(y.shape)


def attach(model: nn.Module, layout: LoraLayout) -> list[MultiLoraLinear]:
    """Replace every target projection of ``model`` by a MultiLoraLinear, in layout order."""
    layers = []
    for t in layout.targets:
        parent_path, name = t.path.rsplit(".", 1)
        parent = model.get_submodule(parent_path)
        base = getattr(parent, name)
        if isinstance(base, MultiLoraLinear):
            base = base.base
        if (base.in_features, base.out_features) != (t.in_features, t.out_features):
            raise ValueError(
                f"{t.path} is {base.in_features}->{base.out_features}, "
                f"the layout expects {t.in_features}->{t.out_features}"
            )
        layer = MultiLoraLinear(base, layout.scaling)
        setattr(parent, name, layer)
        layers.append(layer)
    return layers


def load_population(
    layers: list[MultiLoraLinear],
    population: LoraPopulation | None,
    device: torch.device,
    dtype: torch.dtype,
) -> None:
    """Point every wrapped layer at its slice of the population (None: base model only)."""
    if population is None:
        for layer in layers:
            layer.A = layer.B = None
        return
    for layer, (_, a, b) in zip(layers, population.factors(), strict=True):
        layer.A, layer.B = a.to(device, dtype), b.to(device, dtype)


@contextmanager
def detached(model: nn.Module, layout: LoraLayout, layers: list[MultiLoraLinear]) -> Iterator[None]:
    """Put the plain base projections back into ``model`` for the block (benchmark baselines)."""
    parents = [model.get_submodule(t.path.rsplit(".", 1)[0]) for t in layout.targets]
    names = [t.path.rsplit(".", 1)[1] for t in layout.targets]
    for parent, name, layer in zip(parents, names, layers, strict=True):
        setattr(parent, name, layer.base)
    try:
        yield
    finally:
        for parent, name, layer in zip(parents, names, layers, strict=True):
            setattr(parent, name, layer)
