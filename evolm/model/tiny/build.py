"""Build a tiny Qwen2-architecture causal LM offline, deterministically, in a few seconds.

Same spec -> byte-identical model.safetensors and tokenizer.json. The weights come from a forked
RNG seeded with ``spec.seed`` and a short warm-up (``spec.warmup_steps`` AdamW steps on built-in
text) that turns random weights into a verbose little model that can stop; the global RNG is
left untouched.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Protocol

import torch
from tokenizers import Tokenizer
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from evolm.model.loading import save_checkpoint
from evolm.model.tiny.pretrain import pretrain
from evolm.model.tiny.tokenizer import ENDOFTEXT, IM_END, save_tokenizer, train_tokenizer
from evolm.model.tiny.warmup import WarmupData

logger = logging.getLogger(__name__)

WARMUP_DTYPE = torch.float64
"""The warm-up's dtype (:func:`warm_up` says why not float32)."""


class TinyArch(Protocol):
    """What the builder reads of its spec (:class:`evolm.model.tiny.spec.TinyModel`, which
    imports this module only to build, so the dependency runs one way)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    max_position_embeddings: int
    seed: int
    warmup_steps: int
    countdown_share: float
    countdown_untagged: float


def qwen2_config(spec: TinyArch, bos_id: int, eos_id: int, pad_id: int) -> Qwen2Config:
    """The model config: Qwen2 architecture, tied embeddings, default RoPE, float32."""
    return Qwen2Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        max_window_layers=spec.num_layers,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )


def init_model(config: Qwen2Config, seed: int) -> Qwen2ForCausalLM:
    """Random weights from ``seed`` (forked RNG, so the caller's global RNG is unchanged)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    return model.eval()


def warm_up(
    model: Qwen2ForCausalLM,
    tok: Tokenizer,
    end_id: int,
    spec: TinyArch,
    warmup: WarmupData | None = None,
) -> None:
    """The warm-up (see :mod:`evolm.model.tiny.pretrain`; ``warmup``: the countdown data a
    ``countdown_share`` trains on, passed in from above), machine-independent: in float64, on one
    thread, from a forked RNG (the caller's RNG and threads are untouched), then rounded back
    to the model's float32.

    In float32 the warm-up's result depends on the CPU's kernels: AVX-512 and AVX2 (and MKL's
    per-CPU GEMM paths) round differently, and hundreds of AdamW steps (whose ``m / sqrt(v)``
    magnifies tiny gradient differences) carry that into every weight. float64 shrinks those
    differences (a 60-step build agrees under all of them) but does not remove them: the
    800-step countdown build still differed between kernels. So this function alone is
    deterministic on one machine's kernels; :func:`evolm.model.tiny.pinned.build_pinned` (what
    ``TinyModel.resolve`` runs) pins them, for the same bytes on every AVX2 CPU. float64 costs
    about twice the float32 time.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model.to(WARMUP_DTYPE)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            pretrain(
                model,
                tok,
                end_id,
                spec.warmup_steps,
                seed=spec.seed,
                countdown_share=spec.countdown_share,
                countdown_untagged=spec.countdown_untagged,
                warmup=warmup,
            )
    finally:
        model.to(torch.float32)
        torch.set_num_threads(threads)


def build_tiny_model(out_dir: str | Path, spec: TinyArch, warmup: WarmupData | None = None) -> Path:
    """Write config, safetensors weights, generation config and tokenizer files to ``out_dir``
    (``warmup``: the data of the countdown steps, needed when ``spec.countdown_share > 0``)."""
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(spec.vocab_size)
    endoftext, im_end = tok.token_to_id(ENDOFTEXT), tok.token_to_id(IM_END)
    config = qwen2_config(spec, bos_id=endoftext, eos_id=im_end, pad_id=endoftext)
    model = init_model(config, spec.seed)
    warm_up(model, tok, im_end, spec, warmup)
    model.generation_config = GenerationConfig(
        bos_token_id=endoftext, eos_token_id=[im_end, endoftext], pad_token_id=endoftext
    )
    save_checkpoint(model, out)
    save_tokenizer(tok, out)
    logger.info(
        "tiny model: %d params, %d tokens, built in %.2f s -> %s",
        model.num_parameters(),
        tok.get_vocab_size(),
        time.perf_counter() - start,
        out,
    )
    return out
