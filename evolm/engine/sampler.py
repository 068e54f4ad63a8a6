"""Token choice, shared by both paths of the local engine: the next token from logits (greedy or
temperature / top-p with the caller's ``torch.Generator``), and a row's tokens up to its EOS."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from evolm.sampling import Sampling


def next_token(
    logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None
) -> torch.Tensor:
    """Greedy (temperature 0) or temperature / top-p sampling from the last-position logits."""
    if sampling.temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        drop = sorted_p.cumsum(dim=-1) - sorted_p > sampling.top_p  # keep the nucleus
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def strip_after_eos(tokens: torch.Tensor, eos_ids: Sequence[int]) -> list[list[int]]:
    """Each row's tokens up to (not including) its first EOS."""
    result = []
    for row in tokens.tolist():
        cut = next((i for i, t in enumerate(row) if t in eos_ids), len(row))
        result.append(row[:cut])
    return result
