"""``server=local``: the embedded engine. One in-process model evaluates a whole population.

Every member's rows go into ONE batched generation (rows grouped by member). Two paths compute
the same function:

- the fast path (default where the architecture is supported: Qwen2 / Llama):
  :mod:`evolm.engine.fast.model` (fused projections, grouped LoRA, static KV cache) driven by
  :mod:`evolm.engine.fast.slots` (continuous batching: slots sized by the memory planner of
  :mod:`evolm.engine.fast.plan`, refilled as rows finish, CUDA-graph decode steps per batch
  bucket on GPUs); ``batching="waves"`` keeps the older :mod:`evolm.engine.fast.runner`
  (all rows of a chunk in lock-step);
- the HF path: the transformers model with every target projection wrapped in
  :class:`MultiLoraLinear`, decoded by :func:`generate_tokens`.

CPU runs fp32, CUDA bf16 by default.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evolm.engine.base import Completion, Engine, Row, chat_prompt
from evolm.engine.fast.fp8 import fp8_shape_problem
from evolm.engine.fast.lora import FastLora
from evolm.engine.fast.model import FastModel
from evolm.engine.fast.runner import FastGenerator
from evolm.engine.fast.slots import SlotGenerator
from evolm.engine.fast.weights import unsupported_reason
from evolm.engine.hf.generation import generate_tokens, strip_after_eos
from evolm.engine.hf.kl import Scored, kl_along
from evolm.engine.hf.multilora import attach, load_population
from evolm.engine.kernels import FP8
from evolm.errors import ConfigError
from evolm.lora.layout import LoraLayout, LoraPopulation
from evolm.model import load_causal_lm
from evolm.sampling import Sampling

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":  # the current CUDA device: cuda:LOCAL_RANK in a process group
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            "device",
            f"{device!r} asked for but CUDA is not available",
            "use server.device=cpu or auto",
        )
    return torch.device(device)


def check_batching(utilization: float, batching: str) -> None:
    """Bad ``gpu_memory_utilization`` / ``batching`` values: one ConfigError each."""
    if not 0 < utilization <= 1:
        raise ConfigError(
            "gpu_memory_utilization",
            f"must be in (0, 1], got {utilization}",
            "use e.g. 0.9 (the share of the GPU's memory the engine may fill)",
        )
    if batching not in ("continuous", "waves"):
        raise ConfigError(
            "batching", f"unknown batching {batching!r}", "use continuous (default) or waves"
        )


KV_CACHE_DTYPES = {"auto": None, "fp8": FP8}


def resolve_kv_cache_dtype(kv_cache_dtype: str, batching: str) -> torch.dtype | None:
    """``auto`` (the model's dtype: None) or ``fp8`` (continuous batching only)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ConfigError(
            "kv_cache_dtype",
            f"unknown KV-cache dtype {kv_cache_dtype!r}",
            "use auto (the model's dtype) or fp8 (half the KV bytes, fp8 precision)",
        )
    if kv_cache_dtype != "auto" and batching != "continuous":
        raise ConfigError(
            "kv_cache_dtype",
            f"kv_cache_dtype={kv_cache_dtype} needs continuous batching (batching={batching})",
            "set server.batching=continuous or server.kv_cache_dtype=auto",
        )
    return KV_CACHE_DTYPES[kv_cache_dtype]


QUANTIZATIONS = (None, "fp8")


def check_quantization(quantization: str | None) -> None:
    """``null`` (the model's dtype) or ``fp8``: one ConfigError otherwise."""
    if quantization not in QUANTIZATIONS:
        raise ConfigError(
            "quantization",
            f"unknown quantization {quantization!r}",
            "use null (the model's dtype) or fp8 (fp8 GEMMs for the projections, lossy)",
        )


FP8_OPTIONS = {  # key: (what it is, the fix)
    "kv_cache_dtype": ("an fp8 KV cache", "set server.kv_cache_dtype=auto"),
    "quantization": ("fp8 GEMMs (quantization=fp8)", "unset server.quantization"),
}


def check_fp8_options(
    kv_dtype: torch.dtype | None,
    quantization: str | None,
    fast: bool | None,
    reason: str | None,
    device: torch.device,
) -> None:
    """The fp8 options need the fast path (``fast`` not False, the architecture supported:
    ``reason`` None) and, on GPUs, compute capability >= 8.9 (Ada / Hopper; CPUs run fp8 too,
    slowly, for tests): one ConfigError naming the option otherwise."""
    no_fast = "fast=false" if fast is False else f"the fast path does not support {reason}"
    cap = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    for key, on in (("kv_cache_dtype", kv_dtype is not None), ("quantization", quantization)):
        if not on:
            continue
        what, fix = FP8_OPTIONS[key]
        if fast is False or reason is not None:
            raise ConfigError(key, f"{what} needs the fast path ({no_fast})", fix)
        if cap is not None and cap < (8, 9):
            raise ConfigError(
                key, f"{what} needs a GPU of compute capability >= 8.9, this one is {cap}", fix
            )


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ConfigError("dtype", f"unknown dtype {dtype!r}", f"choose auto or {list(DTYPES)}")
    return DTYPES[dtype]


class LocalEngine(Engine):
    """In-process batched multi-LoRA generation.

    ``LocalEngine.loads`` counts the models loaded in this process (a sweep should load one).

    Args:
        model_path: a local model directory or hub id (completed by the composition root).
        layout: where the adapters go (completed by the composition root).
        device: ``auto`` (CUDA if available), ``cpu``, ``cuda``, ``cuda:1``...
        dtype: ``auto`` (bf16 on CUDA, fp32 on CPU), ``float32``, ``bfloat16``, ``float16``.
        max_batch_rows: continuous batching: at most this many rows decode at once (``None``:
            as many as fit in memory); waves: chunks of whole members of at most this many rows
            (``None``: one batch).
        gpu_memory_utilization: share of the GPU's memory the engine may fill (weights,
            adapters, KV cache, activations); the slot count follows from it.
        batching: ``continuous`` (slots refilled as rows finish) or ``waves`` (lock-step
            chunks; the older path, kept for comparison).
        kv_cache_dtype: ``auto`` (the model's dtype) or ``fp8`` (e4m3, continuous batching
            only, GPUs of compute capability >= 8.9 or CPUs): half the KV bytes of bf16, so
            about twice the slots and half the attention reads. K/V are rounded to fp8 with no
            scale (about 4% relative error per attention output on random data; values beyond
            +-448 saturate, and models with large K values, e.g. Qwen2.x, lose more), so tokens
            differ from the ``auto`` cache's. Opt-in, for throughput.
        quantization: ``null`` (the model's dtype) or ``fp8``: the projections' GEMMs in fp8
            e4m3 (W8A8: one scale per weight output channel, one per token of the input; fast
            path only, GPUs of compute capability >= 8.9 or CPUs). Hopper's fp8 GEMMs ran
            1.4-1.5x faster than bf16 here, so the GEMM-bound shapes (7B, prefill) gain most.
            The LoRA products, attention, norms and the LM head stay in the model's dtype, so the
            members' perturbations are applied exactly; the base model's outputs are rounded
            (~3.7% relative error per projection on random data) and tokens differ from the
            unquantized model's. Opt-in, for throughput; see :mod:`evolm.engine.fast.fp8`.
        threads: CPU threads for torch (``None``: torch's default). Small models on a busy
            machine run faster, and steadier, on 1.
        fast: use the fast path (``None``: where the architecture supports it; ``True``: raise
            if it does not; ``False``: the HF path).
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
        check_batching(gpu_memory_utilization, batching)
        kv_dtype = resolve_kv_cache_dtype(kv_cache_dtype, batching)
        check_quantization(quantization)
        if max_batch_rows is not None and max_batch_rows < 1:
            raise ConfigError(
                "max_batch_rows",
                f"must be >= 1, got {max_batch_rows}",
                "use null for one batch per population",
            )
        if threads is not None and threads < 1:
            raise ConfigError("threads", f"must be >= 1, got {threads}", "null: torch's default")
        if threads is not None:
            torch.set_num_threads(threads)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        check_fp8_options(kv_dtype, quantization, fast, None, self.device)  # before loading
        start = time.perf_counter()
        model, tokenizer = load_causal_lm(model_path, device=str(self.device), dtype=self.dtype)
        LocalEngine.loads += 1
        self.gpu_memory_utilization, self.batching = gpu_memory_utilization, batching
        self.kv_dtype, self.quantization = kv_dtype, quantization
        self._setup(model, tokenizer, layout, max_batch_rows, fast)
        log.info(
            "loaded %s on %s (%s, %s path) in %.1fs",
            model_path,
            self.device,
            self.dtype,
            "fast" if self.fast is not None else "HF",
            time.perf_counter() - start,
        )

    @classmethod
    def from_model(
        cls,
        model: PreTrainedModel,
        layout: LoraLayout,
        tokenizer: PreTrainedTokenizerBase | None = None,
        max_batch_rows: int | None = None,
        fast: bool | None = None,
        gpu_memory_utilization: float = 0.9,
        batching: str = "continuous",
        kv_cache_dtype: str = "auto",
        quantization: str | None = None,
    ) -> LocalEngine:
        """An engine over an already loaded model (benchmarks); ``generate`` needs a tokenizer,
        ``generate_ids`` does not."""
        check_batching(gpu_memory_utilization, batching)
        engine = cls.__new__(cls)
        engine.device, engine.dtype = model.device, model.dtype
        engine.gpu_memory_utilization, engine.batching = gpu_memory_utilization, batching
        engine.kv_dtype = resolve_kv_cache_dtype(kv_cache_dtype, batching)
        check_quantization(quantization)
        engine.quantization = quantization
        engine._setup(model.eval(), tokenizer, layout, max_batch_rows, fast)
        return engine

    def _setup(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None,
        layout: LoraLayout,
        max_batch_rows: int | None,
        fast: bool | None,
    ) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.layout, self.max_batch_rows = layout, max_batch_rows
        self.layers = attach(self.model, layout)
        eos = self.model.generation_config.eos_token_id
        eos_ids = {*([eos] if isinstance(eos, int) else list(eos or []))}
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        self.eos_ids = sorted(eos_ids)
        pad = None if tokenizer is None else tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (self.eos_ids[0] if self.eos_ids else 0)
        self.fast: FastGenerator | None = None
        self.slots: SlotGenerator | None = None
        self._fast_lora: dict[int, FastLora] = {}
        self.lora_pad = 8  # rank columns of a fused group padded to this (see FastLora)
        reason = None if fast is False else unsupported_reason(self.model)
        if fast and reason is not None:
            raise ConfigError("fast", f"the fast path does not support {reason}", "set fast=false")
        check_fp8_options(self.kv_dtype, self.quantization, fast, reason, self.device)
        if fast is not False and reason is None:
            fast_model = FastModel(self.model)
            if self.quantization == "fp8":
                problem = fp8_shape_problem(fast_model) if self.device.type == "cuda" else None
                if problem is not None:
                    raise ConfigError("quantization", problem, "unset server.quantization")
                before = fast_model.weight_bytes()
                fast_model.quantize()
                log.info(
                    "quantization=fp8: fp8 GEMMs for the projections (%.2f GiB of fp8 copies)",
                    (fast_model.weight_bytes() - before) / 2**30,
                )
            self.fast = FastGenerator(fast_model)
            self.slots = SlotGenerator(
                self.fast.model,
                gpu_memory_utilization=self.gpu_memory_utilization,
                kv_dtype=self.kv_dtype,
            )
            cfg = self.model.config
            self.slots.name = str(getattr(cfg, "_name_or_path", "") or cfg.model_type)
        elif reason is not None:
            log.info("local engine: HF path (%s)", reason)

    def use_layout(self, layout: LoraLayout) -> None:
        """Serve adapters of ``layout`` from now on, on the loaded model (a sweep trial with
        another rank or targets; see :mod:`evolm.server.pool`)."""
        self.layout, self.layers = layout, attach(self.model, layout)
        self.reset_fast_path()  # grouped buffers are sized by the rank; graphs hold old buffers

    def update_base_weights(self, named: Mapping[str, torch.Tensor]) -> None:
        """``es.mean=full``: copy ``named`` (e.g. the fp32 master) into the model's weights in
        place (one rounding to the engine's dtype); the fast path's fused buffers are those
        weights, and their fp8 copies are requantized in place, so CUDA graphs stay valid."""
        from evolm.engine.fast.weights import base_linear, refresh_fp8, update_weights

        changed = update_weights(self.model, named)
        if self.fast is not None and self.fast.model.quantized:
            ids = {id(m) for m in changed}
            projs = self.fast.model.projections()
            refresh_fp8([p for p in projs if any(id(base_linear(m)) in ids for m in p.modules)])

    def format_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        return chat_prompt(self.tokenizer, messages)

    def generate(
        self, prompts: Sequence[str], adapters: LoraPopulation | None, sampling: Sampling, seed: int
    ) -> list[list[str]]:
        members = 1 if adapters is None else len(adapters)
        per_chunk = (
            members
            if self.max_batch_rows is None or self._continuous
            else max(1, self.max_batch_rows // len(prompts))
        )
        enc = self.tokenizer(list(prompts), return_tensors="pt", padding=True)
        ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        generator = torch.Generator(self.device).manual_seed(seed)
        out: list[list[str]] = []
        for lo in range(0, members, per_chunk):
            hi = min(members, lo + per_chunk)
            chunk = (
                None
                if adapters is None
                else LoraPopulation(adapters.layout, tuple(t[lo:hi] for t in adapters.tensors))
            )
            tokens = self.generate_ids(
                ids.repeat(hi - lo, 1), mask.repeat(hi - lo, 1), chunk, sampling, generator
            )
            texts = self.completions(tokens)
            out += [texts[m * len(prompts) : (m + 1) * len(prompts)] for m in range(hi - lo)]
        return out

    def generate_rows(
        self,
        prompts: Sequence[str],
        adapters: LoraPopulation | None,
        rows: Sequence[Row],
        sampling: Sampling,
        seed: int,
    ) -> list[str]:
        """Completions of the ``(member, prompt)`` pairs ``rows``, in their order. Continuous
        batching takes rows of any members in any order natively: one call (the waves and HF
        paths: :meth:`Engine.generate_rows`, grouped by member)."""
        if not self._continuous:
            return super().generate_rows(prompts, adapters, rows, sampling, seed)
        enc = self.tokenizer([prompts[p] for _, p in rows], return_tensors="pt", padding=True)
        ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        member = torch.tensor([m for m, _ in rows], dtype=torch.long, device=self.device)
        generator = torch.Generator(self.device).manual_seed(seed)
        tokens = self.generate_slots(
            ids,
            mask,
            None if adapters is None else member,
            adapters,
            [sampling.max_new_tokens] * len(rows),
            sampling,
            generator,
        )
        return self.completions(tokens)

    def completions(self, tokens: torch.Tensor) -> list[str]:
        """The texts of new tokens ``[rows, steps]`` (each row up to its first EOS), as
        :class:`Completion` s: a row without an EOS ran out of budget (truncated)."""
        kept = strip_after_eos(tokens, self.eos_ids)
        texts = self.tokenizer.batch_decode(kept, skip_special_tokens=True)
        steps = tokens.shape[1]
        return [
            Completion(text, truncated=len(ids) == steps, token_ids=ids)
            for text, ids in zip(texts, kept, strict=True)
        ]

    def kl_to_base(
        self, prompts: Sequence[str], completions: Sequence[str], adapter: LoraPopulation
    ) -> list[list[float]]:
        """Per completion, the KL(adapted || base) of the next-token distributions that
        produced it (:mod:`evolm.engine.hf.kl`): a teacher-forced forward of the transformers
        modules with and without the adapter (the fast path's weights are theirs too; with
        ``quantization=fp8`` the unquantized ones)."""
        rows = [self._scored(p, c) for p, c in zip(prompts, completions, strict=True)]

        def use(adapted: bool) -> None:
            load_population(self.layers, adapter if adapted else None, self.device, self.dtype)

        try:
            return kl_along(self.model, rows, use, self.pad_id)
        finally:
            use(False)

    def _scored(self, prompt: str, completion: str) -> Scored:
        """A completion's ids as generated (a plain string: tokenized), plus the EOS step
        unless it was cut at the budget."""
        ids = getattr(completion, "token_ids", None)
        if ids is None:
            ids = self.tokenizer(completion, add_special_tokens=False)["input_ids"]
        ended = getattr(completion, "truncated", None) is not True
        prompt_ids = list(self.tokenizer(prompt)["input_ids"])
        return Scored(prompt_ids, list(ids), len(ids) + ended)

    def generate_ids(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        adapters: LoraPopulation | None,
        sampling: Sampling,
        generator: torch.Generator | None = None,
        eos_ids: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """New tokens ``[rows, <= max_new_tokens]`` for left-padded, member-major rows: with
        adapters, rows are ``len(adapters)`` equal groups; with None, all rows are the base model.
        ``eos_ids`` overrides the model's (``[]``: never stop early)."""
        eos = self.eos_ids if eos_ids is None else list(eos_ids)
        members = 1 if adapters is None else len(adapters)
        if input_ids.shape[0] % members:
            raise ValueError(f"{input_ids.shape[0]} rows do not split into {members} members")
        if self._continuous:
            rows = input_ids.shape[0]
            member = torch.arange(members, device=self.device).repeat_interleave(rows // members)
            return self.generate_slots(
                input_ids,
                attention_mask,
                None if adapters is None else member,
                adapters,
                [sampling.max_new_tokens] * rows,
                sampling,
                generator,
                eos,
            )
        if self.fast is not None:
            lora = None if adapters is None else self.load_fast_lora(adapters)
            return self.fast.generate(
                input_ids, attention_mask, lora, sampling, eos, self.pad_id, generator
            )
        load_population(self.layers, adapters, self.device, self.dtype)
        try:
            return generate_tokens(
                self.model, input_ids, attention_mask, sampling, eos, self.pad_id, generator
            )
        finally:
            load_population(self.layers, None, self.device, self.dtype)

    @property
    def _continuous(self) -> bool:
        return self.slots is not None and self.batching == "continuous"

    def generate_slots(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        member: torch.Tensor | None,
        adapters: LoraPopulation | None,
        budgets: Sequence[int],
        sampling: Sampling,
        generator: torch.Generator | None = None,
        eos_ids: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Continuous batching over rows of any members in any order: row ``i`` is left-padded
        ``input_ids[i]``, adapted by member ``member[i]`` of ``adapters`` (None: the base
        model), and generates at most ``budgets[i]`` tokens. New tokens
        ``[rows, max(budgets)]`` (after a row's EOS or budget: the pad id)."""
        assert self.slots is not None, "continuous batching needs the fast path"
        eos = self.eos_ids if eos_ids is None else list(eos_ids)
        lora = None if adapters is None else self.load_fast_lora(adapters)
        self.slots.max_rows = self.max_batch_rows
        self.slots.utilization = self.gpu_memory_utilization
        return self.slots.generate(
            input_ids,
            attention_mask,
            member,
            lora,
            budgets,
            sampling,
            eos,
            self.pad_id,
            generator,
        )

    def load_fast_lora(self, adapters: LoraPopulation) -> FastLora:
        """The static grouped buffers for ``len(adapters)`` members, holding ``adapters``."""
        assert self.fast is not None
        lora = self._fast_lora.get(len(adapters))
        if lora is None:
            model = self.fast.model
            ins, outs = model.lora_dims()
            # on GPUs the first factors go in spare rows of the weights: one GEMM for both
            spare = model.spare_rows if model.ops.mode == "triton" else None
            version = model.weights_version
            lora = FastLora(
                self.layout, len(adapters), ins, outs, self.device, self.dtype, self.lora_pad, spare
            )
            if model.weights_version != version:  # weights moved: older buffers and graphs
                self.reset_fast_path()
            self._fast_lora[len(adapters)] = lora
        lora.load(adapters)
        return lora

    def reset_fast_path(self) -> None:
        """Drop the grouped adapter buffers and the decode workspace (graphs included), e.g.
        after changing the fast path's settings."""
        self._fast_lora.clear()
        if self.fast is not None:
            self.fast.workspace = None
        if self.slots is not None:
            self.slots.workspace = None

    @property
    def last_timings(self) -> dict[str, float]:
        """Phase times and counts of the last fast-path generation."""
        if self._continuous:
            return dict(self.slots.last_timings)  # type: ignore[union-attr]
        return {} if self.fast is None else dict(self.fast.last_timings)

    def close(self) -> None:
        """Nothing to release beyond memory; kept for the Engine protocol."""
