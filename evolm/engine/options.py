"""The local engine's settings (``server=local``): a local-engine option goes in this file.

:class:`LocalOptions` is frozen and checks itself once, at construction, before any model
loads: each bad value is one :class:`ConfigError` naming its key (relative to ``server``) and the
fix. A new option is a field here (with its check in ``__post_init__``), a keyword of
:class:`~evolm.engine.local.LocalEngine` (its signature is the config schema) and a line in
``conf/server/local.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from evolm.engine.kernels import FP8
from evolm.errors import ConfigError
from evolm.model import load_causal_lm

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
KV_CACHE_DTYPES = {"auto": None, "fp8": FP8}
QUANTIZATIONS = (None, "fp8")
MAX_SPECULATE = 16  # drafted tokens per verify step
FP8_OPTIONS = {  # key: (what it is, the fix)
    "kv_cache_dtype": ("an fp8 KV cache", "set server.kv_cache_dtype=auto"),
    "quantization": ("fp8 GEMMs (quantization=fp8)", "unset server.quantization"),
}
WAVES_REMOVED = (
    "batching=waves (the lock-step path) was removed: continuous batching replaced it. "
    "Measured on one H200 (docs/benchmarks.md, W-real), waves never won: a tie at fixed "
    "lengths (69.7 vs 69.8 s) and 2.9x slower where lengths vary (72.9 vs 25.2 s)"
)


@dataclass(frozen=True)
class LocalOptions:
    """The settings of :class:`~evolm.engine.local.LocalEngine` (``server.*``), checked at
    construction.

    Args:
        device: ``auto`` (CUDA if available), ``cpu``, ``cuda``, ``cuda:1``...
        dtype: ``auto`` (bf16 on CUDA, fp32 on CPU), ``float32``, ``bfloat16``, ``float16``.
        max_batch_rows: at most this many rows decode at once (``None``: as many as fit in
            a GPU's memory; on a CPU every row, refused when they would not fit the host's;
            the HF path: chunks of whole members of at most this many rows).
        gpu_memory_utilization: share of the GPU's memory the engine may fill (weights,
            adapters, KV cache, activations); the slot count follows from it (not on a CPU).
        batching: ``continuous`` (slots refilled as rows finish; the only value: the older
            ``waves`` was removed, see :data:`evolm.engine.options.WAVES_REMOVED`).
        kv_cache_dtype: ``auto`` (the model's dtype) or ``fp8`` (e4m3, GPUs of compute
            capability >= 8.9 or CPUs): half the KV bytes of bf16, so about twice the slots and
            half the attention reads. K/V are rounded to fp8 with no scale (about 4% relative
            error per attention output on random data; values beyond +-448 saturate, and models
            with large K values, e.g. Qwen2.x, lose more), so tokens differ from the ``auto``
            cache's. Opt-in, for throughput.
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
        speculate: tokens drafted per row in the verify steps that replace the decode steps in
            a generation's tail (the queue empty, under a tenth of the slots busy), for greedy
            rows on the fast path: the same tokens as plain decoding, fewer steps where rows
            repeat themselves (:mod:`evolm.engine.fast.speculate`). 0: off (the default: on
            an H100 the chunked verify kernel took 12-13% off a trained 0.5B's generations
            that have a tail and gave the same 6,000 test answers, but a few rows of its
            200-row held-out calls differed, not yet counted: docs/benchmarks.md).
        speculate_rows: with ``speculate``, verify steps once the queue is empty and at most
            this many rows run (``None``: fewer than a tenth of the slots, the tail); a batch
            whose ``speculate + 1`` tokens a row do not fit one forward of the slots takes
            plain decode steps.
        share_prefix: compute the K/V of a prompt prefix once per member and prefill batch and
            copy it into the member's other rows that begin with it (fast path;
            :mod:`evolm.engine.fast.prefix`): prompts with worked examples (``task.shots``)
            share most of their tokens. Off by default until a GPU run shows its answers equal
            plain prefill's, as speculation's were checked. Not with ``kv_cache_dtype=fp8``.
            Sampled rows draw their first tokens in another order (donors first), so a sampled
            run with it on is reproducible but not the run it gives off.
    """

    device: str = "auto"
    dtype: str = "auto"
    max_batch_rows: int | None = None
    threads: int | None = None
    fast: bool | None = None
    gpu_memory_utilization: float = 0.9
    batching: str = "continuous"
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    speculate: int = 0
    speculate_rows: int | None = None
    share_prefix: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(
                "gpu_memory_utilization",
                f"must be in (0, 1], got {self.gpu_memory_utilization}",
                "use e.g. 0.9 (the share of the GPU's memory the engine may fill)",
            )
        if self.batching == "waves":
            raise ConfigError(
                "batching", WAVES_REMOVED, "drop server.batching (or set it to continuous)"
            )
        if self.batching != "continuous":
            raise ConfigError(
                "batching", f"unknown batching {self.batching!r}", "use continuous (the default)"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                "kv_cache_dtype",
                f"unknown KV-cache dtype {self.kv_cache_dtype!r}",
                "use auto (the model's dtype) or fp8 (half the KV bytes, fp8 precision)",
            )
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError(
                "quantization",
                f"unknown quantization {self.quantization!r}",
                "use null (the model's dtype) or fp8 (fp8 GEMMs for the projections, lossy)",
            )
        if self.max_batch_rows is not None and self.max_batch_rows < 1:
            raise ConfigError(
                "max_batch_rows",
                f"must be >= 1, got {self.max_batch_rows}",
                "use null for as many rows as fit in memory",
            )
        if not 0 <= self.speculate <= MAX_SPECULATE:
            raise ConfigError(
                "speculate",
                f"must be in 0..{MAX_SPECULATE}, got {self.speculate}",
                "use 0 (off) or e.g. 4 drafted tokens per verify step",
            )
        if self.share_prefix and self.kv_cache_dtype == "fp8":
            raise ConfigError(
                "share_prefix",
                "with kv_cache_dtype=fp8 a row would attend over its shared prefix's K/V as the "
                "fp8 cache rounds them, where a plain prefill attends over them unrounded (11 of "
                "21 rows of the tiny model's test changed)",
                "drop server.share_prefix, or server.kv_cache_dtype=auto",
            )
        if self.speculate_rows is not None and self.speculate_rows < 1:
            raise ConfigError(
                "speculate_rows",
                f"must be >= 1, got {self.speculate_rows}",
                "use null (under a tenth of the slots: the tail) or e.g. 500",
            )
        if self.speculate and self.fast is False:
            raise ConfigError(
                "speculate",
                "speculative decoding runs on the fast path only, and fast=false",
                "set server.speculate=0, or drop server.fast=false",
            )
        if self.threads is not None and self.threads < 1:
            raise ConfigError(
                "threads", f"must be >= 1, got {self.threads}", "null: torch's default"
            )
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ConfigError(
                "dtype", f"unknown dtype {self.dtype!r}", f"choose auto or {list(DTYPES)}"
            )
        if self.fast is False:
            self.check_fp8(None, None)

    @property
    def kv_dtype(self) -> torch.dtype | None:
        """The KV cache's dtype (None: the model's)."""
        return KV_CACHE_DTYPES[self.kv_cache_dtype]

    def resolve_device(self) -> torch.device:
        if self.device == "auto":  # the current CUDA device: cuda:LOCAL_RANK in a process group
            if torch.cuda.is_available():
                return torch.device("cuda", torch.cuda.current_device())
            return torch.device("cpu")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(
                "device",
                f"{self.device!r} asked for but CUDA is not available",
                "use server.device=cpu or auto",
            )
        return torch.device(self.device)

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if device.type == "cuda" else torch.float32
        return DTYPES[self.dtype]

    def load(self, model_path: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        """The model at ``model_path`` and its tokenizer, loaded with these settings (torch's
        CPU threads, the device, the dtype); the fp8 options are checked against the device
        first, before anything loads."""
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        device = self.resolve_device()
        dtype = self.resolve_dtype(device)
        self.check_fp8(None, device)  # before loading
        return load_causal_lm(model_path, device=str(device), dtype=dtype)

    def check_fp8(self, reason: str | None, device: torch.device | None) -> None:
        """The fp8 options need the fast path (``fast`` not False, the architecture supported:
        ``reason`` None) and, on GPUs, compute capability >= 8.9 (Ada / Hopper; CPUs run fp8
        too, slowly, for tests): one ConfigError naming the option otherwise."""
        no_fast = "fast=false" if self.fast is False else f"the fast path does not support {reason}"
        cuda = device is not None and device.type == "cuda"
        cap = torch.cuda.get_device_capability(device) if cuda else None
        for key, on in (
            ("kv_cache_dtype", self.kv_dtype is not None),
            ("quantization", self.quantization),
        ):
            if not on:
                continue
            what, fix = FP8_OPTIONS[key]
            if self.fast is False or reason is not None:
                raise ConfigError(key, f"{what} needs the fast path ({no_fast})", fix)
            if cap is not None and cap < (8, 9):
                raise ConfigError(
                    key, f"{what} needs a GPU of compute capability >= 8.9, this one is {cap}", fix
                )


@dataclass(frozen=True)
class Tuning:
    """Knobs of the fast path for benchmarks and tests, not config keys (the defaults are what
    users run): passed to ``benchmarks.harness.from_model`` / ``with_options``.

    Args:
        cuda_graphs: capture decode steps as CUDA graphs (None: on CUDA devices; False: eager,
            so a profiler lists the kernels one by one).
        prefill_tokens: tokens per prefill chunk (None: from a memory budget).
        lora_pad: rank columns of a fused LoRA group padded to this (Triton ops: at least 16,
            a power of 2).
    """

    cuda_graphs: bool | None = None
    prefill_tokens: int | None = None
    lora_pad: int = 8
