"""Run with ``TRITON_INTERPRET=1`` (set before Triton is imported): the Triton kernels and the
whole fast path in Triton mode on CPU tensors in fp32. Prints one JSON line of results.

Driven by ``test_triton_interpreted.py`` in a subprocess; the interpreter checks the kernels'
logic (indexing, masks, LoRA offsets, the fused residual add) on the CPU machines, where no GPU
can compile them. bf16 is not checked here: the interpreter's bf16 dot is wrong.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

from test_fastpath import check_forced, check_triton_ops, llama_model, population

from evolm.bench.shapes import build_model
from evolm.engine.local import LocalEngine
from evolm.lora import LoraLayout, LoraSpec


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "set TRITON_INTERPRET=1"
    check_triton_ops(torch.device("cpu"), torch.float32)
    model = build_model("tiny", torch.device("cpu"), torch.float32, seed=3)
    layout = LoraLayout.from_hf_config(model.config, LoraSpec(rank=3))
    engine = LocalEngine.from_model(model, layout, fast=True)
    engine.fast.model.set_ops("triton")
    out = {}
    for prompts in (16, 3):  # rows per member: 16-row kernel programs, or 1-row ones
        out[f"lora_{prompts}"] = check_forced(engine, population(layout, 3), prompts)
        out[f"base_{prompts}"] = check_forced(engine, None, prompts)
    out["spare_rows"] = engine.fast.model.layers[0].qkv.weight.shape[0]
    # SmolLM2's layout (Llama: no q/k/v bias, tied embeddings, 9 / 3 heads, hidden 288)
    llama = llama_model(smol=True)
    layout = LoraLayout.from_hf_config(llama.config, LoraSpec(rank=3))
    engine = LocalEngine.from_model(llama, layout, fast=True)
    engine.fast.model.set_ops("triton")
    out["llama_lora"] = check_forced(engine, population(layout, 2), 2)  # kept short: interpreted
    print(json.dumps(out))


if __name__ == "__main__":
    main()
