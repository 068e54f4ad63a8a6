"""``task=countdown``: reach a target number with the given numbers (the paper's main task).

Reward per completion (see :mod:`evolm.task.countdown_reward`): ``0.1 * format + answer``,
scored on the completion only; ``accuracy`` is 1 when the answer is correct. Puzzles come from
evolm's own generator (:func:`~evolm.task.countdown_data.generate_puzzles`) or from a JSON file
with the fields of the paper's ``countdown.json``; the first ``train_size`` records are the
training split and the rest the test split.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from evolm.errors import ConfigError
from evolm.task.base import Example, Sampling, Scores, Task, cycling_window
from evolm.task.countdown_data import generate_puzzles, load_countdown_json
from evolm.task.countdown_reward import countdown_reward, paper_prompt

log = logging.getLogger(__name__)


SYSTEM_PROMPT = (
    "You are a helpful assistant. You first think about the reasoning process in your mind and "
    "then provide the user with the answer."
)
"""The paper prompt's first sentence: the system message of the chat variant."""

ASSISTANT_PREFIX = "Let me solve this step by step.\n<think>"
"""The paper prompt's ending: appended after the assistant header in the chat variant."""

SCORE_KEYS = ("reward", "format_reward", "answer_reward", "accuracy")


def chat_messages(prompt: str) -> tuple[list[dict[str, str]], str]:
    """Split the paper's verbatim prompt into (system + user messages, assistant prefix)."""
    if not (prompt.startswith(SYSTEM_PROMPT) and prompt.endswith(ASSISTANT_PREFIX)):
        raise ValueError("not a paper prompt: it must start with the system sentence")
    user = prompt[len(SYSTEM_PROMPT) : -len(ASSISTANT_PREFIX)]
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
    return messages, ASSISTANT_PREFIX


def _positive(key: str, value: int, fix: str) -> None:
    if value < 1:
        raise ConfigError(key, f"must be >= 1, got {value}", fix)


def puzzle_key(example: Example) -> tuple[tuple[int, ...], str]:
    """A puzzle whatever the order of its numbers: (sorted numbers, target)."""
    ref = example.reference
    return tuple(sorted(ref["numbers"])), str(ref["target"])


def train_test_overlap(train: Sequence[Example], test: Sequence[Example]) -> int:
    """How many ``test`` puzzles are also ``train`` puzzles (numbers in any order)."""
    seen = {puzzle_key(e) for e in train}
    return sum(puzzle_key(e) in seen for e in test)


class Countdown(Task):
    """The Countdown task.

    Args:
        data_file: a Countdown JSON array (the paper's ``countdown.json``) or JSON-lines file
            with ``numbers`` and ``target``; ``None`` generates ``generate_count`` puzzles.
        train_size: the first ``train_size`` records are the training split, the rest the test
            split (the paper: 200 of 2,200).
        generate_count: how many puzzles to generate when ``data_file`` is ``None``.
        seed: the generator's seed (same seed, same puzzles).
        samples_per_generation: training prompts per generation; generation ``g`` takes the
            ``g``-th window of the training split, wrapping around (:func:`cycling_window`).
        eval_samples: evaluate the mean on the first ``eval_samples`` test records; ``None``
            means the whole test split (larger values are clamped to it).
        chat_template: ``False``: the paper's verbatim prompt; ``True``: a system message (the
            prompt's first sentence), a user message (the rest) and the assistant prefix
            ``"Let me solve this step by step.\\n<think>"``.
        max_new_tokens, temperature, top_p: decoding (the paper: 1024 tokens, greedy).
        stop: stop strings (:attr:`~evolm.sampling.Sampling.stop`), e.g. ``["</answer>"]``: a
            completion ends with its first answer block. The paper's reward reads the LAST
            answer block, so this changes what is scored only for completions that write a
            second one (the paper's runs, with no stop string, scored the last).
    """

    def __init__(
        self,
        data_file: str | None = None,
        train_size: int = 200,
        generate_count: int = 400,
        seed: int = 0,
        samples_per_generation: int = 16,
        eval_samples: int | None = 32,
        chat_template: bool = False,
        max_new_tokens: int = 1024,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] = (),
    ) -> None:
        self.sampling = Sampling(max_new_tokens, temperature, top_p, tuple(stop))
        self.chat_template = chat_template
        self.samples_per_generation = samples_per_generation
        records = self._records(data_file, generate_count, seed)
        self._check_sizes(len(records), train_size, samples_per_generation, eval_samples)
        where = f"{data_file} record" if data_file else f"generated (seed {seed}) puzzle"
        examples = [self._example(r, f"{where} {i}") for i, r in enumerate(records)]
        self.train = examples[:train_size]
        test = examples[train_size:]
        if eval_samples is not None and eval_samples > len(test):
            log.warning("eval_samples=%d > %d test records: using all", eval_samples, len(test))
        self.eval = test[:eval_samples]
        self.overlap = train_test_overlap(self.train, self.eval)
        if self.overlap:
            log.warning(
                "%s: %d of the %d eval puzzles are also training puzzles (same numbers and "
                "target): eval/* is not a held-out score (data/train_test_overlap in the "
                "results). Fix: drop the repeats from one split",
                data_file or "the generated puzzles",
                self.overlap,
                len(self.eval),
            )

    @staticmethod
    def _records(data_file: str | None, generate_count: int, seed: int) -> list[dict[str, Any]]:
        if data_file is not None:
            return load_countdown_json(data_file, key="data_file")
        _positive("generate_count", generate_count, "generate more puzzles than train_size")
        return generate_puzzles(generate_count, seed)

    @staticmethod
    def _check_sizes(
        n: int, train_size: int, per_generation: int, eval_samples: int | None
    ) -> None:
        if not 1 <= train_size < n:
            raise ConfigError(
                "train_size",
                f"must be in [1, {n - 1}] for {n} records (the rest is the test split), "
                f"got {train_size}",
                "lower train_size, or raise generate_count / use a larger data_file",
            )
        _positive("samples_per_generation", per_generation, "e.g. 8")
        if per_generation > train_size:
            raise ConfigError(
                "samples_per_generation",
                f"{per_generation} exceeds the training split ({train_size} records)",
                "use at most train_size prompts per generation",
            )
        if eval_samples is not None:
            _positive("eval_samples", eval_samples, "e.g. 32, or null for the whole test split")

    def _example(self, record: dict[str, Any], source: str) -> Example:
        text = paper_prompt(record["numbers"], record["target"])
        reference = {"numbers": list(record["numbers"]), "target": record["target"]}
        if not self.chat_template:
            return Example(prompt=text, reference=reference, source=source)
        messages, prefix = chat_messages(text)
        return Example(prompt=messages, reference=reference, assistant_prefix=prefix, source=source)

    def train_examples(self, generation: int) -> list[Example]:
        return cycling_window(self.train, generation, self.samples_per_generation)

    def data_stats(self) -> dict[str, float]:
        return {"train_test_overlap": float(self.overlap)}

    def eval_examples(self) -> list[Example]:
        return self.eval

    def score(self, examples: Sequence[Example], completions: Sequence[str]) -> Scores:
        scores: Scores = {k: [] for k in SCORE_KEYS}
        for example, completion in zip(examples, completions, strict=True):
            ref = example.reference
            for key, value in countdown_reward(completion, ref["numbers"], ref["target"]).items():
                scores[key].append(value)
        return scores
