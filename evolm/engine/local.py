"""``server=local``: the embedded engine, one in-process model for a whole population.

:class:`LocalEngine` is the front door: it checks the settings
(:class:`~evolm.engine.options.LocalOptions`), loads the model, wraps its target projections
for adapters (:func:`~evolm.engine.hf.multilora.attach`), picks ONE path at set-up
(:func:`pick`: the fast one or the HF one, :mod:`evolm.engine.backend`) and forwards to it.
docs/architecture.md draws the paths; ``benchmarks.harness`` builds engines over loaded models.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evolm.engine.backend import Backend
from evolm.engine.base import Engine, TextRequest, chat_prompt
from evolm.engine.fast.backend import FastBackend
from evolm.engine.fast.model import FastModel
from evolm.engine.fast.weights import unsupported_reason, update_weights
from evolm.engine.hf.backend import HfBackend
from evolm.engine.hf.kl import kl_to_base
from evolm.engine.hf.multilora import MultiLoraLinear, attach
from evolm.engine.options import LocalOptions, Tuning
from evolm.engine.texts import Texts
from evolm.errors import ConfigError
from evolm.lora.layout import LoraLayout, LoraPopulation
from evolm.sampling import Sampling

log = logging.getLogger(__name__)


def pick(
    model: PreTrainedModel,
    texts: Texts,
    layout: LoraLayout,
    layers: Sequence[MultiLoraLinear],
    options: LocalOptions,
    tuning: Tuning,
    shared: FastModel | None = None,
) -> Backend:
    """The path for ``model``: the fast one unless ``fast=false`` or the architecture is not
    supported (``fast=true`` then: a ConfigError); ``shared``: a sibling's fast forward."""
    reason = None if options.fast is False else unsupported_reason(model)
    if options.fast and reason is not None:
        raise ConfigError("fast", f"the fast path does not support {reason}", "set fast=false")
    options.check_fp8(reason, model.device)
    if options.fast is not False and reason is None:
        return FastBackend(model, texts, layout, options, tuning, shared)
    if reason is not None:
        log.info("local engine: HF path (%s)", reason)
        if options.speculate:
            log.warning("server.speculate=%d is ignored on the HF path", options.speculate)
        if options.share_prefix:
            log.warning("server.share_prefix is ignored on the HF path")
    return HfBackend(model, texts, layers, options.max_batch_rows)


class LocalEngine(Engine):
    """In-process batched multi-LoRA generation (CPU fp32, CUDA bf16 by default).

    ``model_path`` and ``layout`` are completed by the composition root; the other keywords are
    the fields of :class:`~evolm.engine.options.LocalOptions` (documented there; this signature
    is the config schema), checked before the model loads and kept as ``self.options``.
    ``LocalEngine.loads`` counts the models loaded in this process (a sweep should load one).
    """

    loads = 0

    def __init__(
        self,
        model_path: str,
        layout: LoraLayout,
        device: str = "auto",
        dtype: str = "auto",
        max_batch_rows: int | None = None,
        threads: int | None = None,
        fast: bool | None = None,
        gpu_memory_utilization: float = 0.9,
        batching: str = "continuous",
        kv_cache_dtype: str = "auto",
        quantization: str | None = None,
        speculate: int = 0,
        speculate_rows: int | None = None,
        share_prefix: bool = False,
    ) -> None:
        settings = dict(locals())  # every keyword after layout is a field of LocalOptions
        del settings["self"], settings["model_path"], settings["layout"]
        options = LocalOptions(**settings)
        start = time.perf_counter()
        model, tokenizer = options.load(model_path)
        LocalEngine.loads += 1
        self._setup(model, tokenizer, layout, options, Tuning(), None)
        seconds = time.perf_counter() - start
        log.info(
            "loaded %s on %s (%s, %s path) in %.1fs",
            *(model_path, self.device, self.dtype, self.backend.name, seconds),
        )

    @classmethod
    def check_settings(cls, **settings: Any) -> LocalOptions:
        """The settings checked without loading anything (the composition root calls this
        before any model loads); the keywords of the constructor but its runtime arguments."""
        return LocalOptions(**settings)

    def _setup(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None,
        layout: LoraLayout,
        options: LocalOptions,
        tuning: Tuning,
        source: LocalEngine | None,
    ) -> None:
        """Wrap the projections, pick the path (once). ``source``: the engine whose model
        wrappers and fast forward this one shares."""
        self.options, self.tuning = options, tuning
        self.device, self.dtype = model.device, model.dtype
        self.model, self.tokenizer, self.layout = model, tokenizer, layout
        self.layers = attach(model, layout) if source is None else source.layers
        self.texts = Texts(model, tokenizer)
        shared = None if source is None or source.fast is None else source.fast.model
        self.backend = pick(model, self.texts, layout, self.layers, options, tuning, shared)

    @property
    def fast(self) -> FastBackend | None:
        """The fast path (its scheduler, adapter buffers, forced logits), None on the HF path."""
        return self.backend if isinstance(self.backend, FastBackend) else None

    def use_layout(self, layout: LoraLayout) -> None:
        """Serve adapters of ``layout`` from now on, on the loaded model (a sweep trial)."""
        self.layout, self.layers = layout, attach(self.model, layout)
        self.backend.use_layout(layout, self.layers)

    def update_base_weights(self, named: Mapping[str, torch.Tensor]) -> None:
        """``es.mean=full``: ``named`` copied into the model's weights in place (the fast
        path's fused buffers are those weights; its fp8 copies are requantized in place)."""
        self.backend.weights_changed(update_weights(self.model, named))

    def format_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        return chat_prompt(self.tokenizer, messages)

    def check_rows(self, prompts: Sequence[str], rows: int, sampling: Sampling) -> None:
        """The fast path's memory plan for such a call (:meth:`Engine.check_rows`); the HF
        path batches by ``server.max_batch_rows`` and plans nothing."""
        if self.fast is not None:
            self.fast.check_rows(prompts, rows, sampling)

    def generate_rows(self, request: TextRequest) -> list[str]:
        """The rows' completions, in their order, from the path picked at set-up."""
        return self.backend.generate_rows(request)

    def kl_to_base(
        self, prompts: Sequence[str], completions: Sequence[str], adapter: LoraPopulation
    ) -> list[list[float]]:
        """Scored by the transformers modules (:func:`~evolm.engine.hf.kl.kl_to_base`)."""
        return kl_to_base(self.model, self.texts, self.layers, prompts, completions, adapter)

    @property
    def last_timings(self) -> Mapping[str, float]:
        """The last fast-path generation's phase times and counts; empty on the HF path."""
        return self.backend.last_timings

    def close(self) -> None:
        """Release the fast path's adapter buffers and workspace (the model stays loaded)."""
        self.backend.reset()
