"""The harness around the local engine, for benchmarks and tests (the product loads a model by
path and generates texts: :meth:`LocalEngine.generate_rows`): engines over an already loaded
model (:func:`from_model`) and siblings with other settings sharing it (:func:`with_options`),
and generation at the token level (:func:`generate_ids`: rows of any members in any order, each
with its own budget, through the path the engine picked, ``engine.backend``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from evolm.engine.backend import TokenRequest
from evolm.engine.local import LocalEngine
from evolm.engine.options import LocalOptions, Tuning
from evolm.lora import LoraLayout, LoraPopulation
from evolm.sampling import Sampling

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class LoadedEngine(LocalEngine):
    """A local engine over an already loaded ``model`` (no load by path): its projections
    wrapped and its path picked as :class:`LocalEngine` does; ``source``: the engine whose
    model wrappers and fast forward it shares."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None,
        layout: LoraLayout,
        options: LocalOptions,
        tuning: Tuning,
        source: LocalEngine | None = None,
    ) -> None:
        self._setup(model, tokenizer, layout, options, tuning, source)


def generate_ids(
    engine: LocalEngine,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    adapters: LoraPopulation | None,
    sampling: Sampling,
    generator: torch.Generator | None = None,
    *,
    member: torch.Tensor | None = None,
    budgets: Sequence[int] | None = None,
    eos_ids: Sequence[int] | None = None,
) -> torch.Tensor:
    """New tokens ``[rows, max budget]`` for left-padded rows (after a row's EOS or budget: the
    pad id).

    Row ``i`` is adapted by member ``member[i]`` of ``adapters``, rows of any members in any
    order (the fast path only); ``member`` None: the rows are ``len(adapters)`` equal
    member-major groups (``adapters`` None: the base model). ``budgets``: each row's own
    max_new_tokens (the fast path only; None: ``sampling.max_new_tokens`` for every row).
    ``eos_ids`` overrides the model's (``[]``: never stop early)."""
    rows, members = input_ids.shape[0], 1 if adapters is None else len(adapters)
    if member is None and adapters is not None:
        if rows % members:
            raise ValueError(f"{rows} rows do not split into {members} members")
        member = torch.arange(members).repeat_interleave(rows // members)
    eos = engine.texts.eos_ids if eos_ids is None else list(eos_ids)
    request = TokenRequest(input_ids, attention_mask, adapters, sampling, eos, generator)
    return engine.backend.generate_ids(replace(request, member=member, budgets=budgets))


def from_model(
    model: PreTrainedModel,
    layout: LoraLayout,
    tokenizer: PreTrainedTokenizerBase | None = None,
    tuning: Tuning | None = None,
    **settings: Any,
) -> LocalEngine:
    """An engine over an already loaded model; ``settings``: fields of :class:`LocalOptions`
    (``device`` and ``dtype`` are the model's), ``tuning``: the fast path's benchmark knobs.
    Texts need a tokenizer, token ids do not."""
    options = LocalOptions(**settings)
    return LoadedEngine(model.eval(), tokenizer, layout, options, tuning or Tuning())


def with_options(engine: LocalEngine, tuning: Tuning | None = None, **changes: Any) -> LocalEngine:
    """A new engine over ``engine``'s loaded model and fast forward, with some settings changed
    (``max_batch_rows``, ``gpu_memory_utilization``, ``kv_cache_dtype``, ``quantization``) or
    other ``tuning``: a benchmark's methods, a test's caps. ``fast`` cannot change. Both engines
    stay usable: each brings the shared forward's quantization back to its own setting when it
    generates."""
    options = replace(engine.options, **changes)
    if options.fast != engine.options.fast:
        raise ValueError("with_options cannot change the path (fast)")
    tuned = engine.tuning if tuning is None else tuning
    return LoadedEngine(engine.model, engine.tokenizer, engine.layout, options, tuned, engine)
