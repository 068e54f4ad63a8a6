"""The countdown warm-up data for the tiny model (``model.countdown_share``), from evolm's own
generator and chain solver; the composition root hands it to the model build
(:class:`evolm.model.tiny.warmup.WarmupData`), so ``evolm.model`` never imports a task.

A pair is the task's verbatim prompt (:func:`~evolm.task.countdown.reward.paper_prompt`, which
ends with ``<think>``) and a worked answer in the format the reward asks for::

    ...step.\\n<think> 79 + 85 + 34 = 198 </think>\\n<answer> 79 + 85 + 34 </answer>

Only puzzles whose numbers combine left to right in the given order are used (about 60% of
generated ones); the answer is the first such chain
:func:`~evolm.task.countdown.data.solve_chain` finds (operators tried ``+ - * /``): a short,
regular form a 2-layer model can imitate (copy the numbers in order, pick operators).
Puzzles come from :func:`~evolm.task.countdown.data.generate_puzzles` with seeds far from the
task's default seed, so the task's held-out split is not trained on. Most documents use a
short prompt (:func:`short_prompt`): copying numbers is what a tiny model learns slowest, and
short documents teach it at a fraction of the compute.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass

from evolm.task.countdown.data import chain_expression, generate_puzzles, solve_chain
from evolm.task.countdown.reward import paper_prompt

PUZZLE_SEED_OFFSET = 1_000_003
"""Warm-up puzzles use ``generate_puzzles(..., seed=PUZZLE_SEED_OFFSET + seed)``: not the
task's default seed (0), so the default held-out puzzles are never seen in the warm-up."""

FINGERPRINT_PAIRS = 8
"""How many pairs of each kind (full and short prompt, tagged and untagged answers) the
fingerprint hashes: a change to the prompt, the answer format or the generator shows in them."""


def completion(numbers: list[int], ops: str, target: str, tagged: bool = True) -> str:
    """The worked answer after the prompt's ``<think>``: the chain, its value, then the answer
    in ``<answer>`` tags; ``tagged=False`` ends after ``</think>`` (format reward 0.1, not 1)."""
    expr = chain_expression(numbers, ops)
    thought = f" {expr} = {target} </think>"
    return f"{thought}\n<answer> {expr} </answer>" if tagged else thought


def short_prompt(prompt: str) -> str:
    """The paper prompt's puzzle sentence alone, then its ending ``\n<think>``: ``Using the
    numbers [..], create an equation that equals T.\n<think>``."""
    start = prompt.index("Using the numbers")
    middle = prompt.index(" You can use basic")
    return prompt[start:middle] + "\n<think>"


def worked_puzzles(
    count: int, seed: int, short: bool = False, untagged: float = 0.0
) -> Iterator[tuple[str, str]]:
    """``count`` (prompt, completion) pairs of generated puzzles that have an in-order chain
    solution; ``short`` gives the :func:`short_prompt`; an ``untagged`` share of the answers
    (drawn from ``seed``) stop after ``</think>`` without the ``<answer>`` block."""
    draw = random.Random(PUZZLE_SEED_OFFSET + seed)
    made = 0
    batch = 0
    while made < count:
        for record in generate_puzzles(max(64, count), PUZZLE_SEED_OFFSET + seed + batch):
            chain = solve_chain(record["numbers"], record["target"], any_order=False)
            if chain is None:
                continue
            prompt = paper_prompt(record["numbers"], record["target"])
            prompt = short_prompt(prompt) if short else prompt
            tagged = draw.random() >= untagged
            yield prompt, completion(chain[0], chain[1], record["target"], tagged)
            made += 1
            if made == count:
                return
        batch += 1


@dataclass(frozen=True)
class CountdownWarmup:
    """The countdown warm-up pairs (:class:`evolm.model.tiny.warmup.WarmupData`)."""

    def pairs(
        self, count: int, seed: int, short: bool, untagged: float
    ) -> Iterator[tuple[str, str]]:
        return worked_puzzles(count, seed, short, untagged)

    def fingerprint(self) -> str:
        """A hash of sample pairs of every kind: the model cache key covers the warm-up data."""
        sample = [list(self.pairs(FINGERPRINT_PAIRS, 0, short, 0.5)) for short in (False, True)]
        return hashlib.sha256(json.dumps(sample).encode()).hexdigest()[:16]
