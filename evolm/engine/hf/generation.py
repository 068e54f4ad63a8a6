"""A small batched decoding loop: left-padded prefill, then one token per step with a KV cache.

Written out (rather than ``model.generate``) so that sampling draws from an explicit
``torch.Generator``, rows stop at their own EOS, and the loop is one screen to read and tune.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from evolm.engine.sampler import next_token
from evolm.engine.stops import StopTable
from evolm.sampling import Sampling


@torch.inference_mode()
def generate_tokens(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    sampling: Sampling,
    eos_ids: Sequence[int],
    pad_id: int,
    generator: torch.Generator | None = None,
    check_every: int = 8,
    stops: StopTable | None = None,
) -> torch.Tensor:
    """New tokens ``[rows, <= max_new_tokens]``; after a row's EOS, or the token that completes
    one of ``stops``' strings, it holds ``pad_id``.

    ``input_ids`` are left-padded. The loop stops once every row has finished (checked every
    ``check_every`` steps, to spare a host sync per token on GPUs).
    """
    from transformers import DynamicCache  # lazily: importing the engine stays cheap

    rows = input_ids.shape[0]
    eos = torch.tensor(list(eos_ids), device=input_ids.device)
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    finished = torch.zeros(rows, dtype=torch.bool, device=input_ids.device)
    state = torch.zeros(rows, dtype=torch.long, device=input_ids.device)  # stop automaton
    position = positions[:, -1:]
    tokens = []
    for step in range(sampling.max_new_tokens):
        token = next_token(out.logits[:, -1, :], sampling, generator)
        token = token.masked_fill(finished, pad_id)
        tokens.append(token)
        finished |= torch.isin(token, eos)
        if stops is not None:
            state = torch.where(finished, state, stops.advance(state, token))
            finished |= state == stops.done
        if step + 1 == sampling.max_new_tokens or (
            (step + 1) % check_every == 0 and bool(finished.all())
        ):
            break
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(rows, 1)], dim=-1)
        position = position + 1
        out = model(
            input_ids=token[:, None],
            attention_mask=attention_mask,
            position_ids=position,
            past_key_values=cache,
            use_cache=True,
        )
    return torch.stack(tokens, dim=1)
