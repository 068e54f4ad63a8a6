"""An adapter directory's two files, read and checked (no layout needed: the LoRA spec checks
``lora.init_from`` with them before the model's layout is known; :mod:`evolm.lora.peft_io`
writes and loads adapters against a layout)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


class AdapterError(ValueError):
    """An adapter directory that cannot be used; the message names the file and why."""


def read_adapter_config(path: str | Path) -> dict:
    """``<path>/adapter_config.json``, checked to be a readable JSON object with ``r`` and
    ``lora_alpha``; raises :class:`AdapterError` naming the file."""
    file = Path(path) / CONFIG_FILE
    try:
        config = json.loads(file.read_text())
    except FileNotFoundError:
        raise AdapterError(f"{file} does not exist (not an adapter directory?)") from None
    except (OSError, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError, 4300+ digits
        raise AdapterError(f"{file} is not valid JSON (truncated or corrupt): {e}") from None
    if not isinstance(config, dict) or not {"r", "lora_alpha"} <= config.keys():
        raise AdapterError(f"{file} is not a PEFT LoRA config (it lacks r or lora_alpha)")
    return config


def read_adapter_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """``<path>/adapter_model.safetensors``; raises :class:`AdapterError` naming the file."""
    file = Path(path) / WEIGHTS_FILE
    if not file.is_file():
        raise AdapterError(f"{file} does not exist (the adapter was not written completely)")
    try:
        return load_file(str(file))
    except Exception as e:  # safetensors raises its own error types for a damaged header/data
        raise AdapterError(f"{file} cannot be read (truncated or corrupt): {e}") from None
