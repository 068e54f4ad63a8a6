"""``server=local``: the embedded engine. One in-process model evaluates a whole population.

Every member's rows go into ONE batched generation (rows grouped by member); each target
projection adds its member's ``B_m A_m x`` through :class:`MultiLoraLinear`. CPU runs fp32,
CUDA bf16 by default.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

import torch

from evolm.errors import ConfigError
from evolm.lora.layout import LoraLayout, LoraPopulation
from evolm.model import load_causal_lm
from evolm.server.generation import generate_tokens, strip_after_eos
from evolm.server.multilora import attach, load_population
from evolm.task.base import Sampling

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            "device",
            f"{device!r} asked for but CUDA is not available",
            "use server.device=cpu or auto",
        )
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ConfigError("dtype", f"unknown dtype {dtype!r}", f"choose auto or {list(DTYPES)}")
    return DTYPES[dtype]


class LocalEngine:
    """In-process batched multi-LoRA generation.

    ``LocalEngine.loads`` counts the models loaded in this process (a sweep should load one).

    Args:
        model_path: a local model directory or hub id (completed by the composition root).
        layout: where the adapters go (completed by the composition root).
        device: ``auto`` (CUDA if available), ``cpu``, ``cuda``, ``cuda:1``...
        dtype: ``auto`` (bf16 on CUDA, fp32 on CPU), ``float32``, ``bfloat16``, ``float16``.
        max_batch_rows: split a population into chunks of whole members with at most this many
            rows (``None``: everything in one batch).
        threads: CPU threads for torch (``None``: torch's default). Small models on a busy
            machine run faster, and steadier, on 1.
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
    ) -> None:
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
        self.layout = layout
        self.max_batch_rows = max_batch_rows
        start = time.perf_counter()
        self.model, self.tokenizer = load_causal_lm(
            model_path, device=str(self.device), dtype=self.dtype
        )
        LocalEngine.loads += 1
        self.layers = attach(self.model, layout)
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_ids = sorted({*self.eos_ids, self.tokenizer.eos_token_id})
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.eos_ids[0]
        log.info(
            "loaded %s on %s (%s) in %.1fs",
            model_path,
            self.device,
            self.dtype,
            time.perf_counter() - start,
        )

    def format_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(
            [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
        )

    def generate(
        self, prompts: Sequence[str], adapters: LoraPopulation | None, sampling: Sampling, seed: int
    ) -> list[list[str]]:
        members = 1 if adapters is None else len(adapters)
        per_chunk = (
            members if self.max_batch_rows is None else max(1, self.max_batch_rows // len(prompts))
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
            load_population(self.layers, chunk, self.device, self.dtype)
            tokens = generate_tokens(
                self.model,
                ids.repeat(hi - lo, 1),
                mask.repeat(hi - lo, 1),
                sampling,
                self.eos_ids,
                self.pad_id,
                generator,
            )
            texts = self.tokenizer.batch_decode(
                strip_after_eos(tokens, self.eos_ids), skip_special_tokens=True
            )
            out += [texts[m * len(prompts) : (m + 1) * len(prompts)] for m in range(hi - lo)]
        load_population(self.layers, None, self.device, self.dtype)
        return out

    def close(self) -> None:
        """Nothing to release beyond memory; kept for the Engine protocol."""
