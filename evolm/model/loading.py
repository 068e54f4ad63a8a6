"""Load a causal LM and its tokenizer: one code path for tiny and hub models."""

from __future__ import annotations

import logging
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
