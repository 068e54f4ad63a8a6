"""What a population's completions look like beyond their reward: the numbers ES users add by
hand to see a run that learns the wrong thing (names and meanings: :mod:`evolm.metrics`).

Per completion (:func:`completion_stats`): whether it is empty, its length in tokens and whether
it was cut at the token budget (where the engine says: :class:`~evolm.engine.base.Completion`),
and a digest of its text. Per evaluation (:func:`summarize`): how many prompts were scored (the
sampling error of a held-out accuracy needs it), the empty and truncated shares, the mean length,
and across members the distinct completions per prompt and pass@N where the task scores
correctness. Per generation (:func:`pair_agreement`): how many antithetic pairs tied.
The per-completion numbers are plain lists, so a distributed evaluation gathers them with the
scores.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence

import torch

from evolm import metrics as M
from evolm.engine.base import completion_info

RowStats = dict[str, list[float]]
"""Per completion: ``empty`` (1/0), ``tokens`` and ``truncated`` (1/0; NaN: the engine does
not say), ``digest`` (an integer hash of the text, the same in every process)."""


def digest(text: str) -> int:
    """A 62-bit hash of ``text`` (``hash()`` differs between processes)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 2


def completion_stats(completions: Sequence[str]) -> RowStats:
    """The per-completion numbers of :data:`RowStats`."""
    stats: RowStats = {"empty": [], "tokens": [], "truncated": [], "digest": []}
    for text in completions:
        tokens, truncated = completion_info(text)
        stats["empty"].append(float(not text.strip()))
        stats["tokens"].append(math.nan if tokens is None else float(tokens))
        stats["truncated"].append(math.nan if truncated is None else float(truncated))
        stats["digest"].append(digest(text))
    return stats


def summarize(
    stats: Mapping[str, Sequence[float]],
    scores: Mapping[str, Sequence[float]],
    members: int,
    prompts: int,
) -> dict[str, float]:
    """The diagnostics of ``members`` x ``prompts`` completions (member-major rows), keyed by
    the bare names of :mod:`evolm.metrics` (``empty_share``...). A number the engine did not
    give for every row is left out; the across-member ones need two members or more."""
    out = {M.PROMPTS: float(prompts), M.EMPTY_SHARE: _mean(stats["empty"])}
    for key, name in (("tokens", M.COMPLETION_TOKENS), ("truncated", M.TRUNCATED_SHARE)):
        if stats[key] and all(math.isfinite(v) for v in stats[key]):
            out[name] = _mean(stats[key])
    if members < 2:
        return out
    digests = [stats["digest"][m * prompts : (m + 1) * prompts] for m in range(members)]
    distinct = [len({row[p] for row in digests}) for p in range(prompts)]
    out[M.DISTINCT_PER_PROMPT] = sum(distinct) / prompts
    if M.CORRECT_SCORE in scores:
        correct = torch.tensor(scores[M.CORRECT_SCORE], dtype=torch.float64)
        solved = (correct.view(members, prompts) > 0.5).any(dim=0)
        out[M.PASS_AT_POPULATION] = solved.double().mean().item()
    return out


def member_gap_se(member_rewards: Sequence[float], mean_rewards: Sequence[float]) -> float:
    """The standard error of ``train/member_gap`` (the mean's average reward minus the
    members'), paired by prompt: the sample std over the prompts of (the mean's reward on the
    prompt minus the members' average on it), over sqrt(prompts). ``member_rewards`` are the
    members' rows (member-major), ``mean_rewards`` the mean's on the same prompts, in order.
    NaN for fewer than two prompts."""
    mean = torch.tensor(list(mean_rewards), dtype=torch.float64)
    prompts = mean.numel()
    if prompts < 2:
        return math.nan
    members = torch.tensor(list(member_rewards), dtype=torch.float64).view(-1, prompts)
    paired = mean - members.mean(dim=0)
    return (paired.std() / math.sqrt(prompts)).item()


def pair_agreement(
    fitness: torch.Tensor, seeds: Sequence[int], signs: Sequence[int]
) -> float | None:
    """The share of antithetic pairs (members with one seed and opposite signs) whose two
    members got equal fitness (two non-finite values count as equal); None without pairs."""
    first: dict[int, int] = {}
    pairs: list[tuple[int, int]] = []
    for i, (seed, sign) in enumerate(zip(seeds, signs, strict=True)):
        if seed in first and signs[first[seed]] == -sign:
            pairs.append((first.pop(seed), i))
        else:
            first[seed] = i
    if not pairs:
        return None
    values = fitness.detach().to("cpu", torch.float64).tolist()
    ties = sum(_same(values[a], values[b]) for a, b in pairs)
    return ties / len(pairs)


def _same(a: float, b: float) -> bool:
    return a == b or (not math.isfinite(a) and not math.isfinite(b))


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan
