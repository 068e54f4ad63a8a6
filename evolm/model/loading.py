"""Load a causal LM and its tokenizer: one code path for tiny and hub models."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


def load_causal_lm(
    path: str, *, device: str, dtype: torch.dtype
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model (eval mode, SDPA attention, on ``device``) and tokenizer (left padding) at ``path``.

    ``path`` is what a spec's ``resolve()`` returns: a local directory or a hub id.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    model = model.to(device).eval()
    logger.info("loaded %s (%d params, %s, %s)", path, model.num_parameters(), dtype, device)
    return model, tokenizer


def save_checkpoint(model: PreTrainedModel, out: Path) -> None:
    """``model.save_pretrained(out)`` (safetensors) on every rank.

    Under an initialized process group transformers writes only on rank 0; every rank of an
    evolm run that builds a cached model builds it into its own temp folder, and a rank > 0 that
    published its folder first published one without ``config.json`` (the other ranks then
    failed to load it). The build is this process's own, so it writes whatever its rank.
    """
    model.should_save_on_this_rank = lambda is_main_process: True  # type: ignore[method-assign]
    try:
        model.save_pretrained(out, safe_serialization=True)
    finally:
        del model.should_save_on_this_rank
