"""Per-tensor noise scales: uniform, or proportional to the base weights' mean |w| per layer;
and the multipliers handed to ES, in the units ``lora.sigma_units`` gives ``es.sigma``."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from evolm.lora.layout import LoraLayout
from evolm.lora.norms import target_weights
from evolm.lora.spec import LoraSpec


def uniform_scales(layout: LoraLayout) -> list[float]:
    return [1.0] * len(layout.shapes())


def weight_mean_scales(model_dir: str | Path, layout: LoraLayout) -> list[float]:
    """Layer l's A and B tensors get ``mean over its targets of mean|W|`` (seed 000's rule).

    Reads only the target weights from the model's safetensors files (no model load).
    """
    per_layer: dict[int, list[float]] = defaultdict(list)
    for t, w in zip(layout.targets, target_weights(model_dir, layout), strict=True):
        per_layer[t.layer].append(w.float().abs().mean().item())
    layer_scale = {layer: sum(v) / len(v) for layer, v in per_layer.items()}
    return [layer_scale[t.layer] for t in layout.targets for _ in (0, 1)]


def es_scales(spec: LoraSpec, layer_scales: list[float]) -> list[float]:
    """The per-tensor sigma multipliers for :meth:`evolm.es.ES.init`.

    ``factor`` units: the layer scales themselves. ``weight`` units:
    :attr:`LoraSpec.factor_noise_unit` for every tensor (the layer scale is already in A's
    init, which sets how far a unit of B noise moves ``dW``: see the property).
    """
    if spec.sigma_units == "factor":
        return list(layer_scales)
    return [spec.factor_noise_unit] * len(layer_scales)
