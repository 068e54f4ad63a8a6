"""Resource checks a run makes before the model loads (docs/security.md, resource limits).

* The population's adapters must fit in memory: ``es.population_size`` members of
  ``layout.numel()`` fp32 numbers, held about twice (members and their noise) while a generation
  is built, must fit in the memory available now (the GPU's when there is one).
* Every prompt plus ``task.max_new_tokens`` must fit the model's context
  (``max_position_embeddings``): past it the position embeddings are extrapolated and the
  completions are garbage, silently. So must every extra eval's prompts plus its own
  ``extra_evals.<name>.max_new_tokens``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from evolm.errors import ConfigError
from evolm.task.base import Example, Task, run_examples

BYTES_PER_NUMBER = 4  # fp32
COPIES = 2  # members + their noise while ES.sample / ES.tell run


def available_memory() -> tuple[int, str]:
    """``(bytes, where)``: free GPU memory with CUDA, else MemAvailable (Linux) or total RAM."""
    if torch.cuda.is_available():
        return int(torch.cuda.mem_get_info()[0]), "free GPU memory"
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "available RAM"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "RAM"


def population_bytes(numel: int, population_size: int) -> int:
    """Bytes the population's adapters take while a generation is built."""
    return COPIES * BYTES_PER_NUMBER * numel * population_size


def check_population_memory(
    numel: int, population_size: int, available: tuple[int, str] | None = None
) -> None:
    """Refuse a population whose adapters cannot fit in memory (``available``: measured)."""
    need = population_bytes(numel, population_size)
    have, where = available or available_memory()
    if need > have:
        gib = 2**30
        raise ConfigError(
            "es.population_size",
            f"{population_size} members x {numel:,} LoRA numbers need about {need / gib:.1f} GiB "
            f"for the adapters alone, more than the {have / gib:.1f} GiB of {where}",
            "lower es.population_size or lora.rank (or adapt fewer lora.target_modules / "
            "lora.target_layers)",
        )


def prompt_tokens(tokenizer: Any, examples: Sequence[Example]) -> list[tuple[int, Example]]:
    """``(tokens, example)`` of every distinct prompt, counted as the engines count them: the
    raw text, or the chat template plus the assistant prefix, with the tokenizer's specials."""
    from evolm.engine.base import chat_prompt

    texts: dict[str, Example] = {}
    for example in examples:
        if isinstance(example.prompt, str):
            text = example.prompt
        else:
            text = chat_prompt(tokenizer, example.prompt) + example.assistant_prefix
        texts.setdefault(text, example)
    if not texts:
        return []
    ids = tokenizer(list(texts))["input_ids"]
    return [(len(i), e) for i, e in zip(ids, texts.values(), strict=True)]


def check_context(
    lengths: Sequence[tuple[int, Example]],
    max_new_tokens: int,
    positions: int,
    model: str,
    group: str = "task",
) -> None:
    """Refuse a prompt the model's ``positions`` (``max_position_embeddings``) cannot hold, or
    a ``max_new_tokens`` that the longest prompt leaves no room for (``group``: the task's
    config node, ``task`` or ``extra_evals.<name>``)."""
    if not lengths:
        return
    longest, example = max(lengths, key=lambda pair: pair[0])
    where = example.source or f"the prompt {str(example.prompt)[:60]!r}..."
    if longest >= positions:
        raise ConfigError(
            group,
            f"{where} is {longest} tokens long, at least the {positions} positions of the "
            f"model {model} (max_position_embeddings): nothing could be generated after it",
            "shorten or drop that record, or use a model with a longer context",
        )
    if longest + max_new_tokens > positions:
        raise ConfigError(
            f"{group}.max_new_tokens",
            f"{max_new_tokens} new tokens after the longest prompt ({longest} tokens: {where}) "
            f"need {longest + max_new_tokens} positions, more than the {positions} of the model "
            f"{model} (max_position_embeddings)",
            f"set {group}.max_new_tokens={positions - longest} or less, or shorten that prompt",
        )


def check_prompts_fit(
    model_path: str, task: Task, generations: int, extra_evals: Mapping[str, Task] | None = None
) -> None:
    """:func:`check_context` for the prompts a run of ``generations`` uses, and for the eval
    prompts of each of ``extra_evals`` with its own token budget, counted with the model's
    tokenizer, against its ``max_position_embeddings`` (a model without one: no check)."""
    from transformers import AutoConfig, AutoTokenizer

    positions = getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)
    if not positions:
        return
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    checked = [("task", task, generations)]
    checked += [(f"extra_evals.{name}", t, 0) for name, t in (extra_evals or {}).items()]
    for group, each, gens in checked:  # an extra eval reads its eval split only
        examples = [e for _, batch in run_examples(each, gens) for e in batch]
        lengths = prompt_tokens(tokenizer, examples)
        check_context(lengths, each.sampling.max_new_tokens, int(positions), model_path, group)
