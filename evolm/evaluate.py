"""Evaluate a population on a task: the one place that knows both an engine and a task."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from evolm.engine.base import Engine
from evolm.lora.layout import LoraPopulation
from evolm.task.base import Example, Task


@dataclass(frozen=True)
class Evaluation:
    """Per-member fitness (mean reward over prompts), mean task metrics, and timings."""

    fitness: torch.Tensor  # [M] float64
    metrics: dict[str, float]  # mean of every score key over all completions
    completions: list[list[str]]  # [M][P]
    generate_s: float
    score_s: float


def render(engine: Engine, example: Example) -> str:
    """The prompt text the model sees: raw text, or the chat template plus assistant prefix."""
    if isinstance(example.prompt, str):
        return example.prompt
    return engine.format_chat(example.prompt) + example.assistant_prefix


def evaluate(
    engine: Engine,
    task: Task,
    examples: Sequence[Example],
    adapters: LoraPopulation | None,
    seed: int,
) -> Evaluation:
    """Generate every member's completions in one engine call and score them in one batch."""
    start = time.perf_counter()
    completions = engine.generate(
        [render(engine, e) for e in examples], adapters, task.sampling, seed
    )
    generated = time.perf_counter()
    flat = [c for member in completions for c in member]
    scores = task.score(list(examples) * len(completions), flat)
    if "reward" not in scores:
        raise KeyError(f"{type(task).__name__}.score must return a 'reward' list")
    table = {
        k: torch.tensor(v, dtype=torch.float64).view(len(completions), len(examples))
        for k, v in scores.items()
    }
    return Evaluation(
        fitness=table["reward"].mean(dim=1),
        metrics={k: v.mean().item() for k, v in table.items()},
        completions=completions,
        generate_s=generated - start,
        score_s=time.perf_counter() - generated,
    )
