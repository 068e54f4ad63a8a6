"""How much the adapters change the weights they adapt, relative to those weights.

An adapter changes target ``k``'s weight by ``dW_k = scaling * B_k A_k``. ES moves the factors,
so one generation's update changes it by ``scaling * (B'A' - BA)``. Their Frobenius norms come
from ``r x r`` Gram matrices, never the ``out x in`` products: for ``X = [B', -B]`` and
``Y = [A'; A]``, ``||X Y||_F^2 = sum((X^T X) * (Y Y^T))``. Relative to the base weights:
``sqrt(sum_k ||dW_k||^2) / sqrt(sum_k ||W_k||^2)`` over every adapted target.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from functools import lru_cache
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from evolm.lora.layout import LoraLayout

READ_ERRORS = (OSError, KeyError, SafetensorError)
"""What reading a model's weights raises when its files are missing, not safetensors, or lack
a target."""


def target_weights(model_dir: str | Path, layout: LoraLayout) -> Iterator[torch.Tensor]:
    """Each target's base weight, in layout order, read from the model's safetensors files
    (one tensor at a time: no model load)."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
    else:
        weight_map = defaultdict(lambda: "model.safetensors")
    for t in layout.targets:
        name = f"{t.path}.weight"
        with safe_open(str(model_dir / weight_map[name]), framework="pt") as f:
            yield f.get_tensor(name)


@lru_cache(maxsize=4)  # a sweep's trials share a model: read it once per layout
def weight_norm(model_dir: str, layout: LoraLayout) -> float:
    """``sqrt(sum_k ||W_k||_F^2)`` over the base weights of ``layout``'s targets."""
    total = 0.0
    for w in target_weights(model_dir, layout):
        total += torch.linalg.vector_norm(w, dtype=torch.float64).item() ** 2
    return math.sqrt(total)


def delta_norm(
    layout: LoraLayout, after: Sequence[torch.Tensor], before: Sequence[torch.Tensor] | None
) -> float:
    """``sqrt(sum_k ||dW_k||_F^2)`` of the change from the adapter ``before`` (None: no
    adapter) to ``after`` (ES tensors in layout order), computed from the factors."""
    total = torch.zeros((), dtype=torch.float64, device=after[0].device)
    old = layout.pairs(before) if before is not None else None
    for _, a, b in layout.pairs(after):
        x, y = b.double(), a.double()
        if old is not None:
            _, a0, b0 = next(old)
            x, y = torch.cat([x, -b0.double()], dim=1), torch.cat([y, a0.double()], dim=0)
        total += ((x.T @ x) * (y @ y.T)).sum().clamp(min=0.0)
    return layout.scaling * math.sqrt(total.item())
