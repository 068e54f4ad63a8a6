"""The task's training puzzles as TRL's dataset, and its reward as a TRL reward function.

Prompts are rendered as evolm's engines render them (the raw prompt, or the chat template and
the assistant prefix), so TRL tokenizes the very text an ES member answers. Every completion is
scored by the task's own ``score`` (countdown: ``0.1 * format + answer``), on the text up to
its first stop string (:func:`evolm.sampling.cut_at_stop`): TRL's ``model.generate`` path has no
stop strings (trl#2820), so a completion may run on past one; its reward is the reward of the
text an evolm engine would have returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from evolm import metrics as M
from evolm.engine.base import chat_prompt
from evolm.sampling import cut_at_stop
from evolm.task.base import CHECKED_GENERATIONS, Example, Task

INDEX = "example"
"""The dataset column that names each row's training example (its index in the split)."""


def render(tokenizer: Any, example: Example) -> str:
    """The prompt text the model sees (:func:`evolm.evaluate.render`'s rule)."""
    if isinstance(example.prompt, str):
        return example.prompt
    return chat_prompt(tokenizer, example.prompt) + example.assistant_prefix


def train_split(task: Task) -> list[Example]:
    """Every distinct training example the task's windows visit (countdown: its ``train_size``
    puzzles), in order of first use: the puzzles ES trains on. Stops at the first window that
    brings nothing new (at most :data:`~evolm.task.base.CHECKED_GENERATIONS` windows)."""
    seen: dict[str, Example] = {}
    for generation in range(1, CHECKED_GENERATIONS + 1):
        window = {repr((e.prompt, e.reference)): e for e in task.train_examples(generation)}
        fresh = {k: e for k, e in window.items() if k not in seen}
        if not fresh:
            break
        seen |= fresh
    return list(seen.values())


def train_dataset(tokenizer: Any, examples: Sequence[Example]) -> Any:
    """TRL's dataset: ``prompt`` (plain text) and the example's index."""
    from datasets import Dataset

    return Dataset.from_dict(
        {"prompt": [render(tokenizer, e) for e in examples], INDEX: list(range(len(examples)))}
    )


@dataclass
class StepStats:
    """What the reward saw since the last optimizer step: the task's scores, the completions'
    lengths in tokens (EOS not counted) and how many ran out of budget."""

    scores: dict[str, list[float]] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)
    truncated: int = 0

    def record(self) -> dict[str, float]:
        """``train/fitness_mean`` (the mean reward, as a population's), ``train/<k>_mean``,
        ``train/completion_tokens``, ``train/truncated_share`` and ``train/tokens``."""
        if not self.tokens:
            return {}
        n = len(self.tokens)
        out = {M.FITNESS_MEAN: sum(self.scores["reward"]) / n}
        for key, values in self.scores.items():
            if key != "reward" and not M.is_private_score(key):
                out[M.train_score(key)] = sum(values) / n
        out[M.train_diagnostic(M.COMPLETION_TOKENS)] = sum(self.tokens) / n
        out[M.train_diagnostic(M.TRUNCATED_SHARE)] = self.truncated / n
        out[TOKENS] = float(sum(self.tokens))
        return out


TOKENS = "train/tokens"
"""Tokens generated for one update (every completion's, EOS not counted)."""


class TaskReward:
    """TRL reward function over a task's ``score`` (one call per generation batch)."""

    __name__ = "task_reward"  # TRL names the reward's logs after it

    def __init__(
        self, task: Task, examples: Sequence[Example], eos_ids: Sequence[int], max_tokens: int
    ) -> None:
        self.task, self.examples = task, list(examples)
        self.eos_ids, self.max_tokens = set(eos_ids), max_tokens
        self.stats = StepStats()

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        completion_ids: Sequence[Sequence[int]],
        **columns: Any,
    ) -> list[float]:
        examples = [self.examples[i] for i in columns[INDEX]]
        texts = [cut_at_stop(c, self.task.sampling.stop)[0] for c in completions]
        scores = self.task.score(examples, texts)
        for key, values in scores.items():
            self.stats.scores.setdefault(key, []).extend(values)
        for ids in completion_ids:
            ended = bool(ids) and ids[-1] in self.eos_ids
            self.stats.tokens.append(len(ids) - ended)
            self.stats.truncated += not ended and len(ids) >= self.max_tokens
        return list(scores["reward"])

    def drain(self) -> dict[str, float]:
        """The record of what was scored since the last drain, and a fresh start."""
        out, self.stats = self.stats.record(), StepStats()
        return out
