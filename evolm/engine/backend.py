"""The local engine's two paths behind one protocol, picked once when the engine is set up:
:class:`~evolm.engine.fast.backend.FastBackend` (Qwen2 / Llama: fused forward, continuous
batching) or :class:`~evolm.engine.hf.backend.HfBackend` (the transformers modules, any
architecture). Both compute the same function; :class:`~evolm.engine.local.LocalEngine` only
forwards to the one it picked. A generation is one request object: texts
(:class:`~evolm.engine.base.TextRequest`, as every engine takes it) or token ids
(:class:`TokenRequest`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from evolm.engine.base import TextRequest
from evolm.lora.layout import LoraLayout, LoraPopulation
from evolm.sampling import Sampling


@dataclass(frozen=True)
class TokenRequest:
    """Left-padded token rows: row ``i`` is adapted by member ``member[i]`` of ``adapters``
    (``member`` None: the base model; rows of any members in any order on the fast path,
    member-major on the HF path) and stops after ``budgets[i]`` new tokens (None:
    ``sampling.max_new_tokens``; per-row budgets: the fast path only), an EOS of ``eos_ids`` or
    a stop string of ``sampling.stop``; sampled with ``generator``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    adapters: LoraPopulation | None
    sampling: Sampling
    eos_ids: Sequence[int]
    generator: torch.Generator | None = None
    member: torch.Tensor | None = None
    budgets: Sequence[int] | None = None


class Backend(Protocol):
    """One path of the local engine (``name``: "fast" or "HF", as logged)."""

    name: str

    def generate_rows(self, request: TextRequest) -> list[str]:
        """The completions of ``request.rows``, in their order."""
        ...

    def generate_ids(self, request: TokenRequest) -> torch.Tensor:
        """New tokens ``[rows, max budget]`` (after a row's EOS or budget: the pad id)."""
        ...

    def use_layout(self, layout: LoraLayout, layers: Sequence[nn.Module]) -> None:
        """Serve adapters of ``layout`` through the wrapped projections ``layers``
        (:class:`~evolm.engine.hf.multilora.MultiLoraLinear` s)."""
        ...

    def weights_changed(self, changed: Sequence[nn.Module]) -> None:
        """The base linears ``changed`` were updated in place (``es.mean=full``)."""
        ...

    def reset(self) -> None:
        """Drop what was sized for earlier generations (buffers, workspace)."""
        ...

    @property
    def last_timings(self) -> Mapping[str, float]:
        """Phase times and counts of the last generation (empty where none are kept)."""
        ...
