"""Prompt/answer warm-up documents for the tiny model, from data passed in from above.

``evolm.model`` is a leaf: it knows no task. The composition root passes the warm-up data (a
:class:`WarmupData`: the countdown task's worked puzzles, :mod:`evolm.task.countdown.warmup`)
to the build, and the data's :meth:`WarmupData.fingerprint` is part of the model cache key.

A document is a prompt followed by its answer, then the end token; only the answer tokens are
trained (the prompt's labels are -100).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch
from tokenizers import Tokenizer

IGNORE = -100


class WarmupData(Protocol):
    """(prompt, answer) pairs a warm-up trains on, and a hash of what they are."""

    def pairs(
        self, count: int, seed: int, short: bool, untagged: float
    ) -> Iterator[tuple[str, str]]:
        """``count`` pairs drawn from ``seed``; ``short`` prompts leave out the constant
        instructions; an ``untagged`` share of the answers leave out the answer block."""
        ...

    def fingerprint(self) -> str:
        """A short hash that changes whenever the pairs would (the model cache key holds it)."""
        ...


class NoWarmup:
    """No warm-up data (a build without countdown steps): no pairs."""

    def pairs(
        self, count: int, seed: int, short: bool, untagged: float
    ) -> Iterator[tuple[str, str]]:
        return iter(())

    def fingerprint(self) -> str:
        return "none"


def answer_documents(
    tok: Tokenizer,
    end_id: int,
    data: WarmupData,
    count: int,
    seq_len: int,
    seed: int,
    short: bool = False,
    untagged: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, labels)``, each ``[count, seq_len]``: prompt + answer + end token.

    ``short`` documents drop the prompt's constant instructions: at less than half the length
    they teach copying the numbers and the target at twice the pace; the full-prompt documents
    carry the skill over to the task's prompt. ``inputs`` is padded with ``end_id`` (masked out
    by the labels); ``labels[i, t]`` is the token at ``t + 1`` for answer positions and -100 for
    the prompt and the padding.
    """
    inputs = torch.full((count, seq_len), end_id, dtype=torch.long)
    labels = torch.full((count, seq_len), IGNORE, dtype=torch.long)
    for i, (prompt, answer) in enumerate(data.pairs(count, seed, short, untagged)):
        p, a = tok.encode(prompt).ids, [*tok.encode(answer).ids, end_id]
        ids = (p + a)[: seq_len + 1]
        n = len(ids) - 1
        inputs[i, :n] = torch.tensor(ids[:-1])
        target = torch.tensor(ids[1:])
        target[: len(p) - 1] = IGNORE  # predict only the answer (and the end token)
        labels[i, :n] = target
    return inputs, labels
