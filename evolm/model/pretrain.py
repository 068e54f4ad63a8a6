"""A short, deterministic language-model warm-up for the tiny model.

Random weights only ever repeat one token, so a random tiny model never stops and every LoRA
perturbation looks alike to a reward. A few hundred AdamW steps on the built-in corpus (1-3 lines
per document, each ended by ``<|im_end|>``) give a model that writes text of varied length and
then stops: a miniature of a verbose instruct model, which is what ES fine-tuning starts from.
"""

from __future__ import annotations

import logging
import random

import torch
from tokenizers import Tokenizer
from torch import nn

from evolm.model.corpus import WORDS, build_corpus

VERBOSE_SHARE = 0.6
VERBOSE = (
    "That is a good question. Let me think about it step by step before I give the answer.",
    "Here is a detailed explanation, with every step written out so that it is easy to follow.",
    "Let me explain this carefully, because the answer depends on a few simple facts.",
)

logger = logging.getLogger(__name__)


def documents(tok: Tokenizer, end_id: int, count: int, seq_len: int, seed: int) -> torch.Tensor:
    """``count`` token rows of ``seq_len + 1`` (-100 padded): a question, then either a terse
    answer or one of a few fixed verbose sentences, then the end token."""
    rng = random.Random(seed)
    lines = [line for line in build_corpus(0) if line.strip() and "\n" not in line]
    questions = [line for line in lines if line.rstrip().endswith(("?", "=", ":"))]
    terse = [w.capitalize() + "." for w in WORDS[:40]] + [f"{n}." for n in range(20)]
    rows = torch.full((count, seq_len + 1), -100, dtype=torch.long)
    for i in range(count):
        answer = rng.choice(VERBOSE) if rng.random() < VERBOSE_SHARE else rng.choice(terse)
        ids = ([*tok.encode(f"{rng.choice(questions)} {answer}").ids, end_id])[: seq_len + 1]
        rows[i, : len(ids)] = torch.tensor(ids)
    return rows


def pretrain(
    model: nn.Module,
    tok: Tokenizer,
    end_id: int,
    steps: int,
    seed: int,
    batch_size: int = 16,
    seq_len: int = 64,
    lr: float = 3e-3,
) -> float:
    """Train ``model`` in place for ``steps`` AdamW steps; returns the final loss."""
    if steps == 0:
        return float("nan")
    data = documents(tok, end_id, steps * batch_size, seq_len, seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps)
    loss = torch.tensor(float("nan"))
    for step in range(steps):
        batch = data[step * batch_size : (step + 1) * batch_size]
        inputs = batch[:, :-1].clamp(min=0)
        mask = batch[:, :-1] >= 0
        logits = model(input_ids=inputs, attention_mask=mask.long()).logits
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    model.eval()
    logger.info("tiny model warm-up: %d steps, final loss %.3f", steps, loss.item())
    return loss.item()
