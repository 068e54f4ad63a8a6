"""Adapters on disk in PEFT format, loadable unchanged by peft, SGLang and vLLM.

``adapter_config.json`` (``peft_type: LORA``, ``r``, ``lora_alpha``, ``target_modules``,
``use_rslora: false``) and ``adapter_model.safetensors`` with PEFT key names
(``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``). Writes are atomic:
a directory is written beside the target and renamed into place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

from evolm.files import publish_dir, temp_dir_beside
from evolm.lora.adapter_files import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    AdapterError,
    read_adapter_config,
    read_adapter_weights,
)
from evolm.lora.layout import LoraLayout

__all__ = [
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "AdapterError",
    "adapter_config",
    "load_adapter",
    "read_adapter_config",
    "read_adapter_weights",
    "save_adapter",
]


def adapter_config(layout: LoraLayout, base_model: str) -> dict:
    """The PEFT ``LoraConfig`` fields every server reads; ``lora_alpha`` always explicit."""
    all_layers = layout.target_layers == list(range(layout.num_layers))
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": layout.rank,
        "lora_alpha": layout.alpha,
        "target_modules": layout.target_modules,
        "layers_to_transform": None if all_layers else layout.target_layers,
        "lora_dropout": 0.0,
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "inference_mode": True,
    }


def save_adapter(
    path: str | Path,
    layout: LoraLayout,
    tensors: Sequence[torch.Tensor],
    base_model: str,
    dtype: torch.dtype = torch.float32,
    extra: Mapping[str, str] | None = None,
) -> Path:
    """Write one adapter directory atomically (replacing any previous one) and return it;
    ``extra``: more text files in it, by name (e.g. ``best.json``)."""
    path = Path(path)
    if len(tensors) != len(layout.shapes()):
        raise ValueError(f"{len(tensors)} tensors for a layout of {len(layout.shapes())}")
    with temp_dir_beside(path) as tmp:
        state = {
            k: t.detach().to("cpu", dtype).contiguous()
            for k, t in zip(layout.peft_keys(), tensors, strict=True)
        }
        save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(json.dumps(adapter_config(layout, base_model), indent=2))
        for name, text in (extra or {}).items():
            (tmp / name).write_text(text)
        publish_dir(tmp, path)
    return path


def load_adapter(path: str | Path, layout: LoraLayout) -> list[torch.Tensor]:
    """Read an adapter written for ``layout`` back as fp32 tensors in layout order; an adapter
    that is damaged or of another rank/shape raises :class:`AdapterError` naming the file."""
    path = Path(path)
    config = read_adapter_config(path)
    if config["r"] != layout.rank or float(config["lora_alpha"]) != float(layout.alpha):
        raise AdapterError(
            f"{path / CONFIG_FILE}: r={config['r']}, lora_alpha={config['lora_alpha']} does not "
            f"match the layout's r={layout.rank}, alpha={layout.alpha}"
        )
    state = read_adapter_weights(path)
    missing = [k for k in layout.peft_keys() if k not in state]
    if missing:
        raise AdapterError(
            f"{path / WEIGHTS_FILE}: {len(missing)} tensors missing, e.g. {missing[0]}"
        )
    shapes = dict(zip(layout.peft_keys(), layout.shapes(), strict=True))
    wrong = [k for k, shape in shapes.items() if tuple(state[k].shape) != tuple(shape)]
    if wrong:
        k = wrong[0]
        raise AdapterError(
            f"{path / WEIGHTS_FILE}: {k} has shape {tuple(state[k].shape)}, the layout "
            f"{tuple(shapes[k])} (another rank or model?)"
        )
    return [state[k].float() for k in layout.peft_keys()]
