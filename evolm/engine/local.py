"""``server=local``: the embedded engine. One in-process model evaluates a whole population.

Where things go:

- a local-engine option: a field of :class:`~evolm.engine.options.LocalOptions` (checked there,
  once, before any model loads) and a keyword of :class:`LocalEngine` (its signature is the
  config schema);
- a scheduling change (admission, slots, refill, order of rows):
  :mod:`evolm.engine.fast.scheduler`; one prefill / decode step and its CUDA graphs:
  :mod:`evolm.engine.fast.runner`; buffers and their sizing constants:
  :mod:`evolm.engine.fast.workspace`; how many slots fit: :mod:`evolm.engine.fast.plan`;
  token choice: :mod:`evolm.engine.sampler`.

Every member's rows go into ONE batched generation. Two paths compute the same function, the
path chosen once, at construction:

- the fast path (default where the architecture is supported: Qwen2 / Llama):
  :mod:`evolm.engine.fast.model` (fused projections, grouped LoRA, static KV cache) driven by
  the continuous-batching :class:`~evolm.engine.fast.scheduler.Scheduler` (rows of any members
  in any order, slots sized by the memory planner, refilled as rows finish, CUDA-graph decode
  steps per batch bucket on GPUs);
- the HF path: the transformers model with every target projection wrapped in
  :class:`MultiLoraLinear`, decoded by :func:`generate_tokens` (rows grouped by member).

CPU runs fp32, CUDA bf16 by default.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

from evolm.engine.base import Completion, Engine, Row, chat_prompt, group_rows
from evolm.engine.fast.fp8 import fp8_shape_problem
from evolm.engine.fast.lora import FastLora
from evolm.engine.fast.model import FastModel
from evolm.engine.fast.plan import SlotPlan
from evolm.engine.fast.scheduler import Scheduler
from evolm.engine.fast.weights import unsupported_reason
from evolm.engine.hf.generation import generate_tokens
from evolm.engine.hf.kl import Scored, kl_along
from evolm.engine.hf.multilora import attach, load_population
from evolm.engine.options import LocalOptions, Tuning
from evolm.engine.sampler import prefixes, row_lengths
from evolm.engine.stops import StopTable, stop_table
from evolm.errors import ConfigError
from evolm.lora.layout import LoraLayout, LoraPopulation
from evolm.model import load_causal_lm
from evolm.sampling import Sampling, cut_at_stop

log = logging.getLogger(__name__)


class LocalEngine(Engine):
    """In-process batched multi-LoRA generation.

    ``LocalEngine.loads`` counts the models loaded in this process (a sweep should load one).
    ``model_path`` and ``layout`` are completed by the composition root; the other keywords are
    the fields of :class:`~evolm.engine.options.LocalOptions` (documented there), checked at
    once, before the model loads, and kept as ``self.options``.

    Entry points: :meth:`generate_rows` (the ``(member, prompt)`` rows of any members, texts),
    :meth:`generate` (every member x every prompt), :meth:`generate_ids` (the same on token ids,
    with per-row members and budgets: tests and benchmarks).
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
        log.info(
            "loaded %s on %s (%s, %s path) in %.1fs",
            model_path,
            self.device,
            self.dtype,
            "fast" if self.scheduler is not None else "HF",
            time.perf_counter() - start,
        )

    @classmethod
    def check_settings(cls, **settings: Any) -> LocalOptions:
        """The settings checked without loading anything (the composition root calls this
        before any model loads); the keywords of the constructor but its runtime arguments."""
        return LocalOptions(**settings)

    @classmethod
    def from_model(
        cls,
        model: PreTrainedModel,
        layout: LoraLayout,
        tokenizer: PreTrainedTokenizerBase | None = None,
        tuning: Tuning | None = None,
        **settings: Any,
    ) -> LocalEngine:
        """An engine over an already loaded model (tests, benchmarks); ``settings``: fields of
        :class:`LocalOptions` (``device`` and ``dtype`` are the model's), ``tuning``: the fast
        path's benchmark knobs. ``generate`` needs a tokenizer, :meth:`generate_ids` does not."""
        engine = cls.__new__(cls)
        options = LocalOptions(**settings)
        engine._setup(model.eval(), tokenizer, layout, options, tuning or Tuning(), None)
        return engine

    def with_options(self, tuning: Tuning | None = None, **changes: Any) -> LocalEngine:
        """A new engine over this one's loaded model and fast forward, with some settings
        changed (``max_batch_rows``, ``gpu_memory_utilization``, ``kv_cache_dtype``,
        ``quantization``) or other ``tuning``: a benchmark's methods, a test's caps. ``fast``
        cannot change. Both engines stay usable: each brings the shared forward's quantization
        back to its own setting when it generates."""
        options = dataclasses.replace(self.options, **changes)
        if options.fast != self.options.fast:
            raise ValueError("with_options cannot change the path (fast)")
        engine = type(self).__new__(type(self))
        tuned = self.tuning if tuning is None else tuning
        engine._setup(self.model, self.tokenizer, self.layout, options, tuned, self)
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
        """``source``: the engine whose model wrappers and fast forward this one shares."""
        self.options, self.tuning = options, tuning
        self.device, self.dtype = model.device, model.dtype
        self.model, self.tokenizer = model, tokenizer
        self.layout = layout
        self.layers = attach(model, layout) if source is None else source.layers
        eos = self.model.generation_config.eos_token_id
        eos_ids = {*([eos] if isinstance(eos, int) else list(eos or []))}
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        self.eos_ids = sorted(eos_ids)
        pad = None if tokenizer is None else tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (self.eos_ids[0] if self.eos_ids else 0)
        self.scheduler: Scheduler | None = None
        self._stop_tables: dict[tuple[str, ...], StopTable | None] = {}
        self._fast_lora: dict[int, FastLora] = {}
        self._host_timings: dict[str, float] = {}  # around the last fast-path generation
        self._special_ids = set() if tokenizer is None else set(tokenizer.all_special_ids)
        self._lora_version = -1  # the fast forward's weights_version the buffers were made for
        reason = None if options.fast is False else unsupported_reason(self.model)
        if options.fast and reason is not None:
            raise ConfigError("fast", f"the fast path does not support {reason}", "set fast=false")
        options.check_fp8(reason, self.device)
        if options.fast is False or reason is not None:
            if reason is not None:
                log.info("local engine: HF path (%s)", reason)
            return
        shared = None if source is None or source.scheduler is None else source.scheduler.model
        fast_model = FastModel(self.model) if shared is None else shared
        cfg = self.model.config
        self.scheduler = Scheduler(
            fast_model,
            max_rows=options.max_batch_rows,
            utilization=options.gpu_memory_utilization,
            kv_dtype=options.kv_dtype,
            name=str(getattr(cfg, "_name_or_path", "") or cfg.model_type),
            graphs=tuning.cuda_graphs,
            prefill_tokens=tuning.prefill_tokens,
        )
        self._match_quantization()

    def _match_quantization(self) -> None:
        """The fast forward's fp8 copies as ``quantization`` says (a sibling engine of
        :meth:`with_options` may have changed them)."""
        assert self.scheduler is not None
        fast_model, on = self.scheduler.model, self.options.quantization == "fp8"
        if fast_model.quantized == on:
            return
        if on:
            problem = fp8_shape_problem(fast_model) if self.device.type == "cuda" else None
            if problem is not None:
                raise ConfigError("quantization", problem, "unset server.quantization")
        before = fast_model.weight_bytes()
        fast_model.quantize(on)
        if on:
            log.info(
                "quantization=fp8: fp8 GEMMs for the projections (%.2f GiB of fp8 copies)",
                (fast_model.weight_bytes() - before) / 2**30,
            )

    @property
    def fast_path(self) -> bool:
        """True where the fast path generates (else the HF path)."""
        return self.scheduler is not None

    @property
    def plan(self) -> SlotPlan | None:
        """The memory plan of the last fast-path generation (slots, bytes per slot, budget)."""
        return None if self.scheduler is None else self.scheduler.plan

    def use_layout(self, layout: LoraLayout) -> None:
        """Serve adapters of ``layout`` from now on, on the loaded model (a sweep trial with
        another rank or targets; see :mod:`evolm.engine.pool`)."""
        self.layout, self.layers = layout, attach(self.model, layout)
        self.reset_fast_path()  # grouped buffers are sized by the rank; graphs hold old buffers

    def update_base_weights(self, named: Mapping[str, torch.Tensor]) -> None:
        """``es.mean=full``: copy ``named`` (e.g. the fp32 master) into the model's weights in
        place (one rounding to the engine's dtype); the fast path's fused buffers are those
        weights, and their fp8 copies are requantized in place, so CUDA graphs stay valid."""
        from evolm.engine.fast.weights import base_linear, refresh_fp8, update_weights

        changed = update_weights(self.model, named)
        if self.scheduler is not None and self.scheduler.model.quantized:
            ids = {id(m) for m in changed}
            projs = self.scheduler.model.projections()
            refresh_fp8([p for p in projs if any(id(base_linear(m)) in ids for m in p.modules)])

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
        path groups them by the prompts they answer (:func:`group_rows`: one to three groups
        for a shard) and generates each group's members in chunks of whole members of at most
        ``max_batch_rows`` rows."""
        if self.scheduler is None:
            done: dict[Row, str] = {}
            for chosen, members in group_rows(rows).items():
                sub = None if adapters is None else adapters.subset(members)
                out = self._generate_members([prompts[p] for p in chosen], sub, sampling, seed)
                for m, texts in zip(members, out, strict=True):
                    done.update({(m, p): text for p, text in zip(chosen, texts, strict=True)})
            return [done[row] for row in rows]
        start = time.perf_counter()
        # each distinct prompt once (a generation's rows repeat its prompts once per member),
        # padded among the prompts the rows use: the same tensors as tokenizing every row
        used = sorted({p for _, p in rows})
        enc = self.tokenizer([prompts[p] for p in used], return_tensors="pt", padding=True)
        at = {p: i for i, p in enumerate(used)}
        index = torch.tensor([at[p] for _, p in rows], dtype=torch.long)
        enc = {k: enc[k][index] for k in ("input_ids", "attention_mask")}
        member = torch.tensor([m for m, _ in rows], dtype=torch.long)
        generator = torch.Generator(self.device).manual_seed(seed)
        tokenized = time.perf_counter()
        tokens = self.generate_ids(
            enc["input_ids"],
            enc["attention_mask"],
            adapters,
            sampling,
            generator,
            member=None if adapters is None else member,
        )
        generated = time.perf_counter()
        texts = self.completions(tokens, sampling.stop)
        self._host_timings.update(
            host_tokenize_s=tokenized - start, host_detokenize_s=time.perf_counter() - generated
        )
        return texts

    def _generate_members(
        self, prompts: Sequence[str], adapters: LoraPopulation | None, sampling: Sampling, seed: int
    ) -> list[list[str]]:
        """The HF path: every member x every prompt, member-major, in chunks of whole members
        of at most ``max_batch_rows`` rows."""
        members = 1 if adapters is None else len(adapters)
        cap = self.options.max_batch_rows
        per_chunk = members if cap is None else max(1, cap // len(prompts))
        enc = self.tokenizer(list(prompts), return_tensors="pt", padding=True)
        ids, mask = enc["input_ids"], enc["attention_mask"]
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
            texts = self.completions(tokens, sampling.stop)
            out += [texts[m * len(prompts) : (m + 1) * len(prompts)] for m in range(hi - lo)]
        return out

    def completions(self, tokens: torch.Tensor, stop: tuple[str, ...] = ()) -> list[str]:
        """The texts of new tokens ``[rows, steps]`` (each row up to its first EOS, then cut
        after its first stop string: :func:`~evolm.sampling.cut_at_stop`), as
        :class:`Completion` s: a row without an EOS or stop string ran out of budget
        (truncated)."""
        ends, bodies = row_lengths(tokens, self.eos_ids, self.pad_id)
        special = self.pad_id in self._special_ids  # trailing pads decode to nothing
        heads = prefixes(tokens, bodies if special else ends)
        texts = self.tokenizer.batch_decode(heads, skip_special_tokens=True)
        steps = tokens.shape[1]
        exact = self.stop_table(stop) is not None  # rows ended at the stop: nothing to search
        out = []
        for row, (text, ids) in enumerate(zip(texts, heads, strict=True)):
            cut, stopped = cut_at_stop(text, stop)
            if stopped:  # after the stop, the row holds pad ids
                ids = ids[: bodies[row]]
                ids = ids if exact else self._stop_prefix(ids, stop)
            elif len(ids) < ends[row]:  # pads the model wrote itself: they are its tokens
                ids = tokens[row, : ends[row]].tolist()
            truncated = not stopped and len(ids) == steps
            out.append(Completion(cut, truncated=truncated, token_ids=ids, stopped=stopped))
        return out

    def _stop_prefix(self, ids: list[int], stop: tuple[str, ...]) -> list[int]:
        """The shortest prefix of ``ids`` (a row that ran on past its stop string, without its
        trailing pads) whose text holds a stop string: the tokens that were generated, found by
        bisection (a decode per step)."""
        lo, hi = 1, len(ids)  # the shortest prefix length with a stop string is in [lo, hi]
        if cut_at_stop(self.tokenizer.decode(ids[:-1], skip_special_tokens=True), stop)[1]:
            while lo < hi:
                mid = (lo + hi) // 2
                text = self.tokenizer.decode(ids[:mid], skip_special_tokens=True)
                lo, hi = (lo, mid) if cut_at_stop(text, stop)[1] else (mid + 1, hi)
        return ids[:hi]

    def stop_table(self, stop: tuple[str, ...]) -> StopTable | None:
        """The device automaton of the stop strings ``stop`` (:mod:`evolm.engine.stops`), built
        once per set of strings; None without stop strings or a byte-level tokenizer."""
        if stop not in self._stop_tables:
            vocab = self.model.get_output_embeddings().weight.shape[0]
            table = None
            if self.tokenizer is not None:
                table = stop_table(self.tokenizer, vocab, stop, self.device)
            self._stop_tables[stop] = table
        return self._stop_tables[stop]

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
        # the EOS step is scored where one was generated: not at the budget or a stop string
        ended = not (getattr(completion, "truncated", None) or getattr(completion, "stopped", None))
        prompt_ids = list(self.tokenizer(prompt)["input_ids"])
        return Scored(prompt_ids, list(ids), len(ids) + ended)

    def generate_ids(
        self,
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
        """New tokens ``[rows, max budget]`` for left-padded rows (after a row's EOS or budget:
        the pad id): the one token-level entry point.

        Row ``i`` is adapted by member ``member[i]`` of ``adapters``, rows of any members in any
        order (the fast path only); ``member`` None: the rows are ``len(adapters)`` equal
        member-major groups (``adapters`` None: the base model). ``budgets``: each row's own
        max_new_tokens (the fast path only; None: ``sampling.max_new_tokens`` for every row).
        ``eos_ids`` overrides the model's (``[]``: never stop early)."""
        eos = self.eos_ids if eos_ids is None else list(eos_ids)
        stops = self.stop_table(sampling.stop)
        rows = input_ids.shape[0]
        members = 1 if adapters is None else len(adapters)
        if member is None:
            if rows % members:
                raise ValueError(f"{rows} rows do not split into {members} members")
            if adapters is not None:
                member = torch.arange(members).repeat_interleave(rows // members)
        if self.scheduler is not None:
            self._match_quantization()
            staging = time.perf_counter()
            lora = None if adapters is None else self.load_fast_lora(adapters)
            self._host_timings = {"host_stage_s": time.perf_counter() - staging}
            return self.scheduler.run(
                input_ids,
                attention_mask,
                member,
                lora,
                [sampling.max_new_tokens] * rows if budgets is None else budgets,
                sampling,
                eos,
                self.pad_id,
                generator,
                stops,
            )
        grouped = member is None or torch.equal(
            member.cpu(), torch.arange(members).repeat_interleave(rows // members)
        )
        if not grouped or (budgets is not None and set(budgets) != {sampling.max_new_tokens}):
            raise ValueError("rows of any member and per-row budgets need the fast path")
        load_population(self.layers, adapters, self.device, self.dtype)
        try:
            return generate_tokens(
                self.model,
                input_ids.to(self.device),
                attention_mask.to(self.device),
                sampling,
                eos,
                self.pad_id,
                generator,
                stops=stops,
            )
        finally:
            load_population(self.layers, None, self.device, self.dtype)

    def load_fast_lora(self, adapters: LoraPopulation) -> FastLora:
        """The static grouped buffers for ``len(adapters)`` members, holding ``adapters``."""
        assert self.scheduler is not None, "the fast path's adapter buffers"
        model = self.scheduler.model
        if model.weights_version != self._lora_version:  # weights moved (here or a sibling's)
            self.reset_fast_path()
        lora = self._fast_lora.get(len(adapters))
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
                self.reset_fast_path()
            self._fast_lora[len(adapters)] = lora
            self._lora_version = model.weights_version
        lora.load(adapters)
        return lora

    def forced_logits(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        adapters: LoraPopulation | None,
        forced: torch.Tensor,
    ) -> torch.Tensor:
        """Logits ``[rows, T + 1, vocab]`` of the fast path after the prompt and after each of
        the ``T`` tokens of ``forced [rows, T]`` (checks against a reference); member-major rows
        as :meth:`generate_ids`'s."""
        assert self.scheduler is not None, "forced logits are the fast path's"
        self._match_quantization()
        lora = None if adapters is None else self.load_fast_lora(adapters)
        return self.scheduler.forced_logits(input_ids, attention_mask, lora, forced)

    def reset_fast_path(self) -> None:
        """Drop the grouped adapter buffers and the decode workspace (graphs included), e.g.
        after the fast forward's weights moved."""
        self._fast_lora.clear()
        if self.scheduler is not None:
            self.scheduler.reset()

    @property
    def last_timings(self) -> dict[str, float]:
        """Phase times and counts of the last fast-path generation, with the host's time
        around it (``host_tokenize_s``, ``host_stage_s``: the adapters into the grouped
        buffers, ``host_detokenize_s``: token ids to completions, stop strings cut)."""
        if self.scheduler is None:
            return {}
        return {**self.scheduler.last_timings, **self._host_timings}

    def close(self) -> None:
        """Release the fast path's adapter buffers and workspace (the model stays loaded)."""
        self.reset_fast_path()
