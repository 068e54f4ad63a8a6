"""The HF path behind :class:`~evolm.engine.local.LocalEngine` (its
:class:`~evolm.engine.backend.Backend`): the transformers model with its target projections
wrapped in :class:`~.multilora.MultiLoraLinear`, decoded by :func:`~.generation.generate_tokens`,
rows grouped by member."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from evolm.engine.backend import TokenRequest
from evolm.engine.base import Row, TextRequest, group_rows
from evolm.engine.hf.generation import generate_tokens
from evolm.engine.hf.multilora import MultiLoraLinear, load_population
from evolm.engine.texts import Texts
from evolm.lora.layout import LoraLayout, LoraPopulation
from evolm.sampling import Sampling

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class HfBackend:
    """Member-major batches of at most ``max_batch_rows`` rows (None: no cap) through the wrapped
    projections ``layers``."""

    name = "HF"

    def __init__(
        self,
        model: PreTrainedModel,
        texts: Texts,
        layers: Sequence[nn.Module],
        max_batch_rows: int | None,
    ) -> None:
        self.model, self.texts, self.max_batch_rows = model, texts, max_batch_rows
        self.device, self.dtype = model.device, model.dtype
        self.use_layout(None, layers)

    def generate_rows(self, request: TextRequest) -> list[str]:
        """The rows grouped by the prompts they answer (:func:`group_rows`: one to three groups
        for a shard), each group's members in chunks of whole members."""
        done: dict[Row, str] = {}
        adapters, prompts = request.adapters, request.prompts
        for chosen, members in group_rows(request.rows).items():
            sub = None if adapters is None else adapters.subset(members)
            texts = [prompts[p] for p in chosen]
            out = self._generate_members(texts, sub, request.sampling, request.seed)
            for m, completions in zip(members, out, strict=True):
                done.update({(m, p): c for p, c in zip(chosen, completions, strict=True)})
        return [done[row] for row in request.rows]

    def _generate_members(
        self, prompts: Sequence[str], adapters: LoraPopulation | None, sampling: Sampling, seed: int
    ) -> list[list[str]]:
        """Every member x every prompt, member-major, in chunks of whole members of at most
        ``max_batch_rows`` rows."""
        members = 1 if adapters is None else len(adapters)
        cap = self.max_batch_rows
        per_chunk = members if cap is None else max(1, cap // len(prompts))
        ids, mask = self.texts.encode(list(prompts))
        generator = torch.Generator(self.device).manual_seed(seed)
        out: list[list[str]] = []
        for lo in range(0, members, per_chunk):
            hi = min(members, lo + per_chunk)
            chunk = (
                None
                if adapters is None
                else LoraPopulation(adapters.layout, tuple(t[lo:hi] for t in adapters.tensors))
            )
            eos = self.texts.eos_ids
            request = TokenRequest(
                ids.repeat(hi - lo, 1), mask.repeat(hi - lo, 1), chunk, sampling, eos, generator
            )
            tokens = self.generate_ids(request)
            texts = self.texts.completions(tokens, sampling.stop)
            out += [texts[m * len(prompts) : (m + 1) * len(prompts)] for m in range(hi - lo)]
        return out

    def generate_ids(self, request: TokenRequest) -> torch.Tensor:
        """New tokens of member-major rows with one budget (``sampling.max_new_tokens``)."""
        adapters, sampling, budgets = request.adapters, request.sampling, request.budgets
        member = request.member
        rows, members = request.input_ids.shape[0], 1 if adapters is None else len(adapters)
        grouped = member is None or torch.equal(
            member.cpu(), torch.arange(members).repeat_interleave(rows // members)
        )
        if not grouped or (budgets is not None and set(budgets) != {sampling.max_new_tokens}):
            raise ValueError("rows of any member and per-row budgets need the fast path")
        load_population(self.layers, adapters, self.device, self.dtype)
        try:
            return generate_tokens(
                self.model,
                request.input_ids.to(self.device),
                request.attention_mask.to(self.device),
                sampling,
                request.eos_ids,
                self.texts.pad_id,
                request.generator,
                stops=self.texts.stop_table(sampling.stop),
            )
        finally:
            load_population(self.layers, None, self.device, self.dtype)

    def use_layout(self, layout: LoraLayout | None, layers: Sequence[nn.Module]) -> None:
        self.layers = cast(list[MultiLoraLinear], list(layers))

    def weights_changed(self, changed: Sequence[nn.Module]) -> None:
        """Nothing to do: the wrapped projections are the weights."""

    def reset(self) -> None:
        """Nothing is kept between generations."""

    @property
    def last_timings(self) -> dict[str, float]:
        return {}
