"""The fast path behind :class:`~evolm.engine.local.LocalEngine` (its
:class:`~evolm.engine.backend.Backend`): texts in, the adapters staged into static grouped
buffers, one :meth:`Scheduler.run <.scheduler.Scheduler.run>` over rows of any members in any
order, texts out; the fp8 copies kept as ``quantization`` says."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from evolm.engine.backend import TokenRequest
from evolm.engine.base import TextRequest
from evolm.engine.fast.fp8 import fp8_shape_problem
from evolm.engine.fast.lora import FastLora
from evolm.engine.fast.model import FastModel
from evolm.engine.fast.scheduler import Scheduler
from evolm.engine.fast.weights import base_linear, refresh_fp8
from evolm.engine.options import LocalOptions, Tuning
from evolm.engine.texts import RowDecoder, Texts
from evolm.errors import ConfigError
from evolm.lora.layout import LoraLayout, LoraPopulation
from evolm.sampling import Sampling

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)


class FastBackend:
    """The fast path over ``model`` (``shared``: a sibling engine's fast forward, reused).

    ``scheduler`` (continuous batching) and :meth:`load_lora` / :meth:`forced_logits` are
    public for tests and benchmarks; the engine calls the :class:`Backend` methods."""

    name = "fast"

    def __init__(
        self,
        model: PreTrainedModel,
        texts: Texts,
        layout: LoraLayout,
        options: LocalOptions,
        tuning: Tuning,
        shared: FastModel | None = None,
    ) -> None:
        self.texts, self.layout, self.options, self.tuning = texts, layout, options, tuning
        self.device, self.dtype = model.device, model.dtype
        cfg = model.config
        self.scheduler = Scheduler(
            FastModel(model) if shared is None else shared,
            max_rows=options.max_batch_rows,
            utilization=options.gpu_memory_utilization,
            kv_dtype=options.kv_dtype,
            name=str(getattr(cfg, "_name_or_path", "") or cfg.model_type),
            graphs=tuning.cuda_graphs,
            prefill_tokens=tuning.prefill_tokens,
            speculate=options.speculate,
            speculate_rows=options.speculate_rows,
            share_prefix=options.share_prefix,
        )
        self._lora: dict[int, FastLora] = {}  # grouped buffers by population size
        self._lora_version = -1  # the fast forward's weights_version the buffers were made for
        self._host_timings: dict[str, float] = {}  # around the last generation
        self.match_quantization()

    @property
    def model(self) -> FastModel:
        """The fast forward (shared with sibling engines of ``with_options``)."""
        return self.scheduler.model

    def generate_rows(self, request: TextRequest) -> list[str]:
        """Rows of any members in any order, in one :meth:`generate_ids`."""
        start = time.perf_counter()
        # each distinct prompt once (a generation's rows repeat its prompts once per member),
        # padded among the prompts the rows use: the same tensors as tokenizing every row
        rows, adapters = request.rows, request.adapters
        used = sorted({p for _, p in rows})
        ids, mask = self.texts.encode([request.prompts[p] for p in used])
        at = {p: i for i, p in enumerate(used)}
        index = torch.tensor([at[p] for _, p in rows], dtype=torch.long)
        member = torch.tensor([m for m, _ in rows], dtype=torch.long)
        generator = torch.Generator(self.device).manual_seed(request.seed)
        tokenized = time.perf_counter()
        # rows are decoded as they finish, beside the engine; what is left waits for the end
        decoder = RowDecoder(self.texts, len(rows), request.sampling.stop, len(rows) // 16)
        try:
            tokens = self.generate_ids(
                TokenRequest(
                    ids[index],
                    mask[index],
                    adapters,
                    request.sampling,
                    self.texts.eos_ids,
                    generator,
                    member=None if adapters is None else member,
                ),
                retired=decoder.retired,
            )
        except BaseException:
            decoder.close()
            raise
        generated = time.perf_counter()
        texts = decoder.finish(tokens)
        self._host_timings.update(
            host_tokenize_s=tokenized - start,
            host_detokenize_s=time.perf_counter() - generated,
            detokenized_early=decoder.early,
        )
        return texts

    def check_rows(self, prompts: Sequence[str], rows: int, sampling: Sampling) -> None:
        """Raise the ConfigError a call of ``rows`` rows over ``prompts`` would raise for
        memory (:meth:`Scheduler.check <.scheduler.Scheduler.check>`), before any such call."""
        ids, _ = self.texts.encode(list(prompts))
        self.scheduler.check(rows, ids.shape[1], sampling.max_new_tokens, sampling.temperature == 0)

    def generate_ids(
        self,
        request: TokenRequest,
        retired: Callable[[list[int], torch.Tensor], None] | None = None,
    ) -> torch.Tensor:
        """New tokens of rows of any members in any order, each with its own budget
        (``retired``: :meth:`Scheduler.run <.scheduler.Scheduler.run>`'s callback)."""
        self.match_quantization()
        staging = time.perf_counter()
        adapters, sampling, budgets = request.adapters, request.sampling, request.budgets
        lora = None if adapters is None else self.load_lora(adapters)
        self._host_timings = {"host_stage_s": time.perf_counter() - staging}
        rows = request.input_ids.shape[0]
        return self.scheduler.run(
            request.input_ids,
            request.attention_mask,
            request.member,
            lora,
            [sampling.max_new_tokens] * rows if budgets is None else budgets,
            sampling,
            request.eos_ids,
            self.texts.pad_id,
            request.generator,
            self.texts.stop_table(sampling.stop),
            retired=retired,
        )

    def forced_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        adapters: LoraPopulation | None,
        forced: torch.Tensor,
    ) -> torch.Tensor:
        """Logits ``[rows, T + 1, vocab]`` after the prompt and after each of the ``T`` tokens
        of ``forced [rows, T]`` (:meth:`Scheduler.forced_logits`; checks against a reference);
        member-major rows."""
        self.match_quantization()
        lora = None if adapters is None else self.load_lora(adapters)
        return self.scheduler.forced_logits(input_ids, attention_mask, lora, forced)

    def load_lora(self, adapters: LoraPopulation) -> FastLora:
        """The static grouped buffers for ``len(adapters)`` members, holding ``adapters``."""
        model = self.model
        if model.weights_version != self._lora_version:  # weights moved (here or a sibling's)
            self.reset()
        lora = self._lora.get(len(adapters))
        if lora is None:
            ins, outs = model.lora_dims()
            # on GPUs the first factors go in spare rows of the weights: one GEMM for both
            spare = model.spare_rows if model.ops.mode == "triton" else None
            version = model.weights_version
            pad = self.tuning.lora_pad
            lora = FastLora(
                self.layout, len(adapters), ins, outs, self.device, self.dtype, pad, spare
            )
            if model.weights_version != version:  # weights moved: older buffers and graphs
                self.reset()
            self._lora[len(adapters)] = lora
            self._lora_version = model.weights_version
        lora.load(adapters)
        return lora

    def match_quantization(self) -> None:
        """The fast forward's fp8 copies as ``quantization`` says (a sibling engine of
        ``with_options`` may have changed them)."""
        model, on = self.model, self.options.quantization == "fp8"
        if model.quantized == on:
            return
        if on:
            problem = fp8_shape_problem(model) if self.device.type == "cuda" else None
            if problem is not None:
                raise ConfigError("quantization", problem, "unset server.quantization")
        before = model.weight_bytes()
        model.quantize(on)
        if on:
            log.info(
                "quantization=fp8: fp8 GEMMs for the projections (%.2f GiB of fp8 copies)",
                (model.weight_bytes() - before) / 2**30,
            )

    def use_layout(self, layout: LoraLayout, layers: Sequence[nn.Module]) -> None:
        """Grouped buffers are sized by the rank, graphs hold old buffers: both dropped."""
        self.layout = layout
        self.reset()

    def weights_changed(self, changed: Sequence[nn.Module]) -> None:
        """The fused buffers are those weights; their fp8 copies are requantized in place, so
        CUDA graphs stay valid."""
        if self.model.quantized:
            ids = {id(m) for m in changed}
            projs = self.model.projections()
            refresh_fp8([p for p in projs if any(id(base_linear(m)) in ids for m in p.modules)])

    def reset(self) -> None:
        """Drop the grouped adapter buffers and the decode workspace (graphs included), e.g.
        after the fast forward's weights moved."""
        self._lora.clear()
        self.scheduler.reset()

    @property
    def last_timings(self) -> dict[str, float]:
        """The scheduler's phases and counts, with the host's time around them
        (``host_tokenize_s``, ``host_stage_s``: the adapters into the grouped buffers,
        ``host_detokenize_s``: token ids to completions, stop strings cut, after the engine;
        ``detokenized_early``: the rows decoded while it ran)."""
        return {**self.scheduler.last_timings, **self._host_timings}
