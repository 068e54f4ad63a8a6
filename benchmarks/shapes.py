"""Model shapes for the benchmark: random weights at real architectures, built locally.

Nothing is downloaded: a transformers ``Qwen2Config`` at the published sizes, instantiated on the
target device with random weights (``initializer_range`` 0.02). No EOS: generation config has
none, so every method generates exactly the forced number of tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedModel, Qwen2Config

SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=2048,
        tie_word_embeddings=True,
    ),
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "qwen2.5-7b": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
}


def shape_config(shape: str) -> Qwen2Config:
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose from {sorted(SHAPES)}")
    return Qwen2Config(
        **SHAPES[shape],
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        use_sliding_window=False,
        hidden_act="silu",
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def build_model(shape: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Any:
    """The random-weight model of ``shape`` on ``device`` (eval mode, SDPA attention)."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(
                shape_config(shape), dtype=dtype, attn_implementation="sdpa"
            )
    model.generation_config = GenerationConfig(eos_token_id=None, pad_token_id=0)
    return model.eval()


def save_model(model: PreTrainedModel, path: str | Path) -> Path:
    """Save weights plus the tiny model's byte-level BPE tokenizer, so servers (and evolm's
    server engines, which send text) can load the directory. Ids past the tokenizer's vocabulary
    are never produced by it, so they only matter to the random model."""
    from evolm.model.tiny.tokenizer import save_tokenizer, train_tokenizer

    out = Path(path)
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(train_tokenizer(2048), out)
    return out


def param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())
