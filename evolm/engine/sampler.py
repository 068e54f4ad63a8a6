"""Token choice, shared by both paths of the local engine: the next token from logits (greedy or
temperature / top-p with the caller's ``torch.Generator``), and a row's tokens up to its EOS."""

from __future__ import annotations

import itertools
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


def row_lengths(
    tokens: torch.Tensor, eos_ids: Sequence[int], pad_id: int | None = None
) -> tuple[list[int], list[int]]:
    """Each row's length up to (not including) its first EOS, and that prefix's length without
    its trailing ``pad_id`` s (what follows a stop string in the engine's output), computed on
    the tensor's device."""
    steps = tokens.shape[1]
    eos = torch.isin(tokens, torch.tensor(list(eos_ids), dtype=tokens.dtype, device=tokens.device))
    ends = torch.where(eos.any(1), eos.int().argmax(1), steps)
    body = torch.arange(steps, device=tokens.device) < ends[:, None]
    if pad_id is not None:
        body &= tokens != pad_id
    bodies = torch.where(body.any(1), steps - body.flip(1).int().argmax(1), 0)
    return ends.tolist(), bodies.tolist()


def prefixes(tokens: torch.Tensor, lengths: Sequence[int]) -> list[list[int]]:
    """Each row's first ``lengths[row]`` ids; only those come to the host (3,480 rows x 1,024
    steps whose rows stop after ~60 tokens move ~0.2M ids, not 3.5M)."""
    at = torch.arange(tokens.shape[1], device=tokens.device)
    flat = tokens[at < torch.tensor(lengths, device=tokens.device)[:, None]].tolist()
    starts = [0, *itertools.accumulate(lengths)]
    return [flat[a:b] for a, b in itertools.pairwise(starts)]
