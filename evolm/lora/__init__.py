"""LoRA adapters as the ES search space: spec, layout, PEFT-format I/O, noise scales."""

from evolm.lora.layout import LoraLayout, LoraPopulation, LoraTarget
from evolm.lora.peft_io import load_adapter, save_adapter
from evolm.lora.scales import es_scales, uniform_scales, weight_mean_scales
from evolm.lora.spec import TARGET_MODULES, LoraSpec

__all__ = [
    "TARGET_MODULES",
    "LoraLayout",
    "LoraPopulation",
    "LoraSpec",
    "LoraTarget",
    "es_scales",
    "load_adapter",
    "save_adapter",
    "uniform_scales",
    "weight_mean_scales",
]
