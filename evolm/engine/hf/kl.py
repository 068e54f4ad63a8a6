"""KL(adapted || base) along given completions: one teacher-forced forward of each model.

For a completion ``y`` of prompt ``x``, the KL at step ``t`` is
``sum_v p_a(v | x, y_<t) * (log p_a(v | x, y_<t) - log p_b(v | x, y_<t))`` between the adapted
model's and the base model's next-token distributions (temperature 1: the models' own, whatever
the sampling temperature). The steps are those that produced the completion: one per token,
plus the step that drew the EOS when the completion ended on one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from evolm.engine.hf.multilora import MultiLoraLinear, load_population
from evolm.engine.texts import Texts
from evolm.lora.layout import LoraPopulation

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class Scored:
    """One sequence to score: its prompt and completion ids, and how many of the completion's
    next-token distributions count (``len(completion)``, +1 when it ended on an EOS)."""

    prompt: list[int]
    completion: list[int]
    steps: int


def scored(tokenizer: Any, prompt: str, completion: str) -> Scored:
    """A completion's ids as generated (a plain string: tokenized), plus the EOS step unless it
    was cut at the budget or a stop string (then no EOS was generated)."""
    ids = getattr(completion, "token_ids", None)
    if ids is None:
        ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    ended = not (getattr(completion, "truncated", None) or getattr(completion, "stopped", None))
    prompt_ids = list(tokenizer(prompt)["input_ids"])
    return Scored(prompt_ids, list(ids), len(ids) + ended)


def _batch(rows: Sequence[Scored], pad_id: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Right-padded ids and mask, and the (row, position) of every distribution scored."""
    seqs = [r.prompt + r.completion for r in rows]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    where_row: list[int] = []
    where_pos: list[int] = []
    for i, (r, s) in enumerate(zip(rows, seqs, strict=True)):
        if not r.prompt:
            raise ValueError("a completion's KL needs a prompt of at least one token")
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
        first = len(r.prompt) - 1  # predicts the completion's first token
        where_row += [i] * r.steps
        where_pos += range(first, first + r.steps)
    index = [torch.tensor(w, dtype=torch.long, device=device) for w in (where_row, where_pos)]
    return ids.to(device), mask.to(device), *index


@torch.inference_mode()
def hidden_states(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The decoder's last hidden states ``[rows, width, hidden]`` (no LM head: it is applied
    only where a distribution is scored)."""
    out = model.get_decoder()(input_ids=ids, attention_mask=mask, use_cache=False)
    return out.last_hidden_state


@torch.inference_mode()
def kl_along(
    model: nn.Module,
    rows: Sequence[Scored],
    set_adapter: Callable[[bool], None],
    pad_id: int,
    max_tokens: int = 8192,
    max_logits: int = 512,
) -> list[list[float]]:
    """Per row, the KL(adapted || base) of each of its ``steps`` distributions, in order.

    ``set_adapter(True)`` makes ``model`` the adapted one, ``set_adapter(False)`` the base.
    Rows go in batches of at most ``max_tokens`` tokens, the LM head over at most
    ``max_logits`` positions at a time (fp32 log-softmax), so memory stays bounded.
    """
    device = next(model.parameters()).device
    head = model.get_output_embeddings()
    out: list[list[float]] = []
    for chunk in _chunks(rows, max_tokens):
        ids, mask, row, pos = _batch(chunk, pad_id, device)
        set_adapter(False)
        base = hidden_states(model, ids, mask)[row, pos]
        set_adapter(True)
        adapted = hidden_states(model, ids, mask)[row, pos]
        kl = torch.cat(
            [
                _kl(head(a).float(), head(b).float())
                for a, b in zip(adapted.split(max_logits), base.split(max_logits), strict=True)
            ]
        ).tolist()
        start = 0
        for r in chunk:
            out.append(kl[start : start + r.steps])
            start += r.steps
    return out


def _kl(adapted: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """KL(p_a || p_b) per row of logits ``[n, vocab]``, clamped at 0 (rounding)."""
    log_a, log_b = F.log_softmax(adapted, dim=-1), F.log_softmax(base, dim=-1)
    return (log_a.exp() * (log_a - log_b)).sum(dim=-1).clamp(min=0.0)


def _chunks(rows: Sequence[Scored], max_tokens: int) -> list[list[Scored]]:
    """Consecutive rows in batches of at most ``max_tokens`` padded tokens (one row at least)."""
    chunks: list[list[Scored]] = []
    current: list[Scored] = []
    width = 0
    for r in rows:
        n = len(r.prompt) + len(r.completion)
        if current and max(width, n) * (len(current) + 1) > max_tokens:
            chunks.append(current)
            current, width = [], 0
        current.append(r)
        width = max(width, n)
    if current:
        chunks.append(current)
    return chunks


def kl_to_base(
    model: PreTrainedModel,
    texts: Texts,
    layers: Sequence[MultiLoraLinear],
    prompts: Sequence[str],
    completions: Sequence[str],
    adapter: LoraPopulation,
) -> list[list[float]]:
    """Per completion, the KL(adapted || base) of the next-token distributions that produced
    it (:meth:`Engine.kl_to_base <evolm.engine.base.Engine.kl_to_base>`): a teacher-forced
    forward of ``model``'s transformers modules with and without ``adapter``, loaded into its
    wrapped projections ``layers`` (the local engine's fast path shares those weights; with
    ``quantization=fp8`` these are the unquantized ones). The base is served again after."""
    rows = [scored(texts.tokenizer, p, c) for p, c in zip(prompts, completions, strict=True)]

    def use(adapted: bool) -> None:
        load_population(layers, adapter if adapted else None, model.device, model.dtype)

    try:
        return kl_along(model, rows, use, texts.pad_id)
    finally:
        use(False)
