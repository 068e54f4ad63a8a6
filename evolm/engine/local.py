"""``server=local``: the embedded engine. One in-process model evaluates a whole population.

:class:`LocalEngine` is the front door: it checks the settings, loads the model, wraps its
target projections for adapters (:func:`~evolm.engine.hf.multilora.attach`; the KL and the HF
path use them), picks ONE path at set-up and forwards to it (:mod:`evolm.engine.backend`):

- the fast path (default where the architecture is supported: Qwen2 / Llama):
  :class:`~evolm.engine.fast.backend.FastBackend`, the fused forward driven by continuous
  batching (:mod:`evolm.engine.fast`: rows of any members in any order, slots sized by the
  memory planner, refilled as rows finish, CUDA-graph decode steps on GPUs);
- the HF path: :class:`~evolm.engine.hf.backend.HfBackend`, the transformers model with every
  target projection a :class:`~evolm.engine.hf.multilora.MultiLoraLinear`, rows grouped by
  member.

Where things go: a local-engine option: a field of :class:`~evolm.engine.options.LocalOptions`
(checked once, before any model loads) and a keyword of :class:`LocalEngine` (its signature is
the config schema); texts and stop strings: :mod:`evolm.engine.texts`; the fast path's parts:
:mod:`evolm.engine.fast`.

CPU runs fp32, CUDA bf16 by default.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evolm.engine.backend import Backend, TextRequest
from evolm.engine.base import Engine, Row, chat_prompt
from evolm.engine.fast.backend import FastBackend
from evolm.engine.fast.model import FastModel
from evolm.engine.fast.weights import unsupported_reason, update_weights
from evolm.engine.hf.backend import HfBackend
from evolm.engine.hf.kl import kl_along, scored
from evolm.engine.hf.multilora import MultiLoraLinear, attach, load_population
from evolm.engine.options import LocalOptions, Tuning
from evolm.engine.texts import Texts
from evolm.errors import ConfigError
from evolm.lora.layout import LoraLayout, LoraPopulation
from evolm.model import load_causal_lm
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
    return HfBackend(model, texts, layers, options.max_batch_rows)


class LocalEngine(Engine):
    """In-process batched multi-LoRA generation.

    ``LocalEngine.loads`` counts the models loaded in this process (a sweep should load one).
    ``model_path`` and ``layout`` are completed by the composition root; the other keywords are
    the fields of :class:`~evolm.engine.options.LocalOptions` (documented there), checked at
    once, before the model loads, and kept as ``self.options``.

    Entry points: :meth:`generate_rows` (the ``(member, prompt)`` rows of any members, texts)
    and :meth:`generate` (every member x every prompt). ``backend`` is the path picked once
    (token ids in and out: ``benchmarks.harness.generate_ids``); :attr:`fast` the fast one, for
    tests and benchmarks to look inside (None on the HF path).
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
    ) -> None:
        options = LocalOptions(
            device=device,
            dtype=dtype,
            max_batch_rows=max_batch_rows,
            threads=threads,
            fast=fast,
            gpu_memory_utilization=gpu_memory_utilization,
            batching=batching,
            kv_cache_dtype=kv_cache_dtype,
            quantization=quantization,
        )
        if options.threads is not None:
            torch.set_num_threads(options.threads)
        torch_device = options.resolve_device()
        torch_dtype = options.resolve_dtype(torch_device)
        options.check_fp8(None, torch_device)  # before loading
        start = time.perf_counter()
        model, tokenizer = load_causal_lm(model_path, device=str(torch_device), dtype=torch_dtype)
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

    @classmethod
    def over(
        cls,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None,
        layout: LoraLayout,
        options: LocalOptions,
        tuning: Tuning,
        source: LocalEngine | None = None,
    ) -> LocalEngine:
        """An engine over an already loaded model (the harness's constructor:
        ``benchmarks.harness``); ``source``: the engine whose model wrappers and fast forward
        it shares."""
        engine = cls.__new__(cls)
        engine._setup(model, tokenizer, layout, options, tuning, source)
        return engine

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
        """Serve adapters of ``layout`` from now on, on the loaded model (a sweep trial with
        another rank or targets; see :mod:`evolm.app.pool`)."""
        self.layout, self.layers = layout, attach(self.model, layout)
        self.backend.use_layout(layout, self.layers)

    def update_base_weights(self, named: Mapping[str, torch.Tensor]) -> None:
        """``es.mean=full``: copy ``named`` (e.g. the fp32 master) into the model's weights in
        place (one rounding to the engine's dtype); the fast path's fused buffers are those
        weights, and their fp8 copies are requantized in place, so CUDA graphs stay valid."""
        self.backend.weights_changed(update_weights(self.model, named))

    def format_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        return chat_prompt(self.tokenizer, messages)

    def generate_rows(
        self,
        prompts: Sequence[str],
        adapters: LoraPopulation | None,
        rows: Sequence[Row],
        sampling: Sampling,
        seed: int,
    ) -> list[str]:
        """Completions of the ``(member, prompt)`` pairs ``rows``, in their order: the one text
        entry point. The fast path takes rows of any members in any order in one call; the HF
        path groups them by the prompts they answer and generates each group's members in
        chunks of whole members of at most ``max_batch_rows`` rows."""
        return self.backend.generate_rows(TextRequest(prompts, adapters, rows, sampling, seed))

    def kl_to_base(
        self, prompts: Sequence[str], completions: Sequence[str], adapter: LoraPopulation
    ) -> list[list[float]]:
        """Per completion, the KL(adapted || base) of the next-token distributions that
        produced it (:mod:`evolm.engine.hf.kl`): a teacher-forced forward of the transformers
        modules with and without the adapter (the fast path's weights are theirs too; with
        ``quantization=fp8`` the unquantized ones)."""
        rows = [scored(self.tokenizer, p, c) for p, c in zip(prompts, completions, strict=True)]

        def use(adapted: bool) -> None:
            load_population(self.layers, adapter if adapted else None, self.device, self.dtype)

        try:
            return kl_along(self.model, rows, use, self.texts.pad_id)
        finally:
            use(False)

    @property
    def last_timings(self) -> Mapping[str, float]:
        """Phase times and counts of the last fast-path generation, with the host's time
        around it (:attr:`FastBackend.last_timings`); empty on the HF path."""
        return self.backend.last_timings

    def close(self) -> None:
        """Release the fast path's adapter buffers and workspace (the model stays loaded)."""
        self.backend.reset()
