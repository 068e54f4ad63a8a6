"""Train and save a Qwen2-compatible byte-level BPE tokenizer for the tiny model.

Trap: with ``model_type=qwen2`` transformers' ``Qwen2Tokenizer`` rebuilds its pipeline (NFC, Qwen's
split regex, ByteLevel without regex, ByteLevel decoder) from the saved vocab and merges, ignoring
the pipeline in tokenizer.json. We train with exactly that pipeline so the ids agree.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
from tokenizers.models import BPE

from evolm.model.tiny.corpus import build_corpus

logger = logging.getLogger(__name__)

# transformers/models/qwen2/tokenization_qwen2.py: PRETOKENIZE_REGEX
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2
CORPUS_SEED = 0  # the corpus is fixed: every tiny model with the same vocab shares a tokenizer
MODEL_MAX_LENGTH = 131072

# Qwen2.5-Instruct's template without the tool-calling branches.
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


def qwen2_pipeline_tokenizer() -> Tokenizer:
    """An empty BPE tokenizer with exactly the pipeline ``Qwen2Tokenizer`` rebuilds."""
    tok = Tokenizer(
        BPE(
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(
        add_prefix_space=False, trim_offsets=False, use_regex=False
    )
    return tok


def train_tokenizer(vocab_size: int) -> Tokenizer:
    """Train the byte-level BPE on the built-in corpus (deterministic, well under a second)."""
    tok = qwen2_pipeline_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(build_corpus(CORPUS_SEED), trainer=trainer)
    if tok.get_vocab_size() < vocab_size:
        logger.info(
            "BPE reached %d of %d tokens on the built-in corpus: the rest are unused rows",
            tok.get_vocab_size(),
            vocab_size,
        )
    return tok


def _added_token_entry(content: str) -> dict[str, Any]:
    return {
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": True,
    }


def tokenizer_config(tok: Tokenizer) -> dict[str, Any]:
    """tokenizer_config.json mirroring Qwen2.5-Instruct's (eos <|im_end|>, pad <|endoftext|>)."""
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(tok.token_to_id(t)): _added_token_entry(t) for t in SPECIAL_TOKENS
        },
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def save_tokenizer(tok: Tokenizer, out_dir: Path) -> None:
    """Write tokenizer.json, vocab.json, merges.txt and tokenizer_config.json (Qwen's file set)."""
    tok.save(str(out_dir / "tokenizer.json"))
    tok.model.save(str(out_dir))  # vocab.json + merges.txt, for loaders that prefer them
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config(tok))
