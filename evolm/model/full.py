"""A plain transformers model directory with some weights replaced (``es.mean=full``'s model).

:func:`save_model` copies a base model directory (config, generation config, tokenizer, any
other file) and rewrites its safetensors files shard by shard with the weights of ``named``
swapped in, cast to each stored tensor's dtype (or ``dtype``): the result loads with
``AutoModelForCausalLM.from_pretrained``, vLLM or SGLang with no merge step. Written into a
hidden folder beside ``path`` and renamed into place (:mod:`evolm.files`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from evolm.files import publish_dir, temp_dir_beside

INDEX = "model.safetensors.index.json"


def weight_files(model_dir: Path) -> list[str]:
    """The safetensors files of a model directory (sharded: those its index names)."""
    index = model_dir / INDEX
    if index.is_file():
        return sorted(set(json.loads(index.read_text())["weight_map"].values()))
    if (model_dir / "model.safetensors").is_file():
        return ["model.safetensors"]
    raise FileNotFoundError(f"{model_dir} holds no model.safetensors nor {INDEX}")


def save_model(
    path: str | Path,
    base_dir: str | Path,
    named: Mapping[str, torch.Tensor],
    dtype: torch.dtype | None = None,
    extra: Mapping[str, str] | None = None,
) -> Path:
    """Write ``base_dir`` with the tensors of ``named`` replaced to ``path`` (atomically,
    replacing an earlier one); every name must exist in the base's weights. ``extra``: more
    text files in it, by name."""
    path, base_dir = Path(path), Path(base_dir)
    files = weight_files(base_dir)
    left = set(named)
    with temp_dir_beside(path) as tmp:
        for item in base_dir.iterdir():
            if item.is_file() and not item.name.startswith(".") and item.suffix != ".safetensors":
                shutil.copyfile(item, tmp / item.name)
        for name in files:
            state = load_file(str(base_dir / name))
            for key in state.keys() & left:
                state[key] = named[key].detach().to("cpu", dtype or state[key].dtype).contiguous()
                left.discard(key)
            save_file(state, str(tmp / name), metadata={"format": "pt"})
            del state
        if left:
            raise KeyError(f"{len(left)} weights are not in {base_dir}, e.g. {sorted(left)[0]}")
        for file, text in (extra or {}).items():
            (tmp / file).write_text(text)
        publish_dir(tmp, path)
    return path
