"""Where Countdown's puzzles come from: two generators, a data file, and dropping templates.

* ``generator=tree`` (the default): evolm's random-expression-tree generator
  (:func:`~evolm.task.countdown.data.tree_records`; about 18% of its puzzles are sums).
* ``generator=uniform``: the TinyZero / Countdown-Tasks style. 3 or 4 numbers (the count
  uniform) drawn from 1..99, a target uniform in ``[target_min, target_max]``, kept only if some
  expression over all the numbers reaches it (:mod:`evolm.task.countdown.solver`).
* ``drop_templates=train|test|both`` leaves out of that split every puzzle a fixed operator
  pattern solves (:mod:`evolm.task.countdown.shortcuts`), so accuracy there cannot come from a
  template. Generated splits keep their sizes: dropped puzzles are replaced by later draws of
  the same stream, so a split that drops nothing is the one it would be without dropping. A
  data file's split is filtered and shrinks. ``drop_size_rules=true`` also leaves out the
  puzzles any other fixed rule solves (a fixed pattern over the numbers sorted largest first,
  or over the puzzle's order with the first number negated).

Both streams are deterministic in ``task.seed``.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Iterator
from typing import Any

from evolm.errors import ConfigError
from evolm.task.countdown.data import puzzle_record, tree_records
from evolm.task.countdown.shortcuts import rule_kinds, solving_patterns
from evolm.task.countdown.solver import solve

log = logging.getLogger(__name__)

__all__ = [
    "DROP_SPLITS",
    "GENERATORS",
    "check_source",
    "drop_split",
    "generated_splits",
    "puzzle_stream",
    "template_solvable",
    "uniform_records",
]

GENERATORS = ("tree", "uniform")
DROP_SPLITS = ("train", "test", "both")
"""``drop_templates`` values besides ``None``."""

UNIFORM_NUMBERS = (3, 4)
UNIFORM_MAX_VALUE = 99
UNIFORM_REACH = (1 - UNIFORM_MAX_VALUE**3, UNIFORM_MAX_VALUE**4)
"""The lowest and highest values 3-4 numbers of 1..99 reach (``1 - 99 * 99 * 99``, ``99**4``)."""
MAX_MISSES = 2_000
"""Draws in a row that may fail (no solvable puzzle, or only templates to drop) before the
source is reported as unable to give its puzzles (a uniform draw: about 1 ms)."""

Record = dict[str, Any]
Placed = tuple[int, Record]
"""A data file's record and its position in the file."""


def check_source(
    generator: str, drop_templates: str | None, target_min: int, target_max: int
) -> None:
    """One ConfigError naming the key, for a generator or drop split evolm does not know, or
    (``generator=uniform``) a target range that is empty or that no puzzle reaches."""
    if generator not in GENERATORS:
        raise ConfigError(
            "generator", f"must be one of {list(GENERATORS)}, got {generator!r}", "e.g. uniform"
        )
    if drop_templates is not None and drop_templates not in DROP_SPLITS:
        raise ConfigError(
            "drop_templates",
            f"must be null or one of {list(DROP_SPLITS)}, got {drop_templates!r}",
            "e.g. drop_templates=test (no template-solvable puzzle in the test split)",
        )
    if generator != "uniform":
        return  # the target range is the uniform generator's alone
    if target_min > target_max:
        raise ConfigError(
            "target_min",
            f"must be <= target_max, got {target_min} > {target_max}",
            "e.g. target_min=1 target_max=100",
        )
    low, high = UNIFORM_REACH
    if not (target_min <= high and target_max >= low):
        key = "target_min" if target_min > high else "target_max"
        raise ConfigError(
            key,
            f"no 3-4 numbers of 1..{UNIFORM_MAX_VALUE} reach a target in "
            f"[{target_min}, {target_max}] (they reach {low}..{high} at most)",
            "e.g. target_min=1 target_max=100",
        )


def puzzle_stream(generator: str, seed: int, target_min: int, target_max: int) -> Iterator[Record]:
    """The endless record stream of ``generator`` (:data:`GENERATORS`) from ``seed``."""
    if generator == "tree":
        return tree_records(seed)
    return uniform_records(seed, target_min, target_max)


def uniform_records(seed: int, target_min: int, target_max: int) -> Iterator[Record]:
    """The endless, deterministic stream of uniform puzzles (see the module doc)."""
    rng = random.Random(seed)
    misses = 0
    for i in itertools.count():
        while True:
            count = rng.randint(*UNIFORM_NUMBERS)
            numbers = [rng.randint(1, UNIFORM_MAX_VALUE) for _ in range(count)]
            target = rng.randint(target_min, target_max)
            solution = solve(numbers, target)
            if solution is not None:
                break
            misses += 1
            if misses > MAX_MISSES:
                raise ConfigError(
                    "target_max",
                    f"no solvable puzzle in {MAX_MISSES} draws with targets in "
                    f"[{target_min}, {target_max}]",
                    "use targets that 3-4 numbers of 1..99 reach, e.g. 1..100",
                )
        misses = 0
        yield puzzle_record(i, numbers, target, solution)


def template_solvable(record: Record, size_rules: bool = False) -> bool:
    """Whether some fixed operator pattern solves the record's puzzle (``size_rules``: or any
    other fixed rule: the same patterns over the numbers sorted largest first, or with the
    first number negated)."""
    numbers, target = record["numbers"], record["target"]
    if size_rules:
        return any(rule_kinds(numbers, target))
    return bool(solving_patterns(numbers, target))


def generated_splits(
    stream: Iterator[Record],
    count: int,
    train_size: int,
    drop: str | None,
    size_rules: bool = False,
) -> tuple[list[Record], list[Record]]:
    """The training and test splits of a generated ``stream``: its first ``count`` records
    (``train_size`` of them train), with each template-solvable puzzle of a ``drop`` split
    (``size_rules``: size-order and first-negated rules count) replaced by the next record of
    the stream that the split keeps."""
    drops = (drop in ("train", "both"), drop in ("test", "both"))
    head = list(itertools.islice(stream, count))
    splits: list[list[Record]] = []
    dropped = 0
    for dropping, part in zip(drops, (head[:train_size], head[train_size:]), strict=True):
        kept = [r for r in part if not (dropping and template_solvable(r, size_rules))]
        dropped += len(part) - len(kept)
        splits.append(kept)
    misses = 0
    for which, size in ((0, train_size), (1, count - train_size)):
        while len(splits[which]) < size:
            record = next(stream)
            if not (drops[which] and template_solvable(record, size_rules)):
                splits[which].append(record)
                misses = 0
                continue
            dropped, misses = dropped + 1, misses + 1
            if misses > MAX_MISSES:
                raise ConfigError(
                    "drop_templates",
                    f"{MAX_MISSES} generated puzzles in a row were template-solvable",
                    "use generator=uniform, or drop_templates=null",
                )
    if drop is not None:
        log.info(
            "drop_templates=%s: replaced %d template-solvable generated puzzles", drop, dropped
        )
    return splits[0], splits[1]


def drop_split(
    records: list[Placed], split: str, where: str, size_rules: bool = False
) -> list[Placed]:
    """A data file's ``split`` (records with their places) without its template-solvable
    puzzles (``size_rules``: size-order and first-negated rules count); logs how many were
    dropped and refuses a split left empty."""
    kept = [(i, r) for i, r in records if not template_solvable(r, size_rules)]
    log.warning(
        "drop_templates: dropped %d of the %d %s puzzles of %s that a fixed operator pattern "
        "solves%s; %d remain",
        len(records) - len(kept),
        len(records),
        split,
        where,
        " (in the puzzle's order, sorted by size or with the first number negated)"
        if size_rules
        else "",
        len(kept),
    )
    if not kept:
        raise ConfigError(
            "drop_templates",
            f"every one of the {len(records)} {split} puzzles of {where} is template-solvable",
            "drop from the other split, or use a data file with other puzzles",
        )
    return kept
