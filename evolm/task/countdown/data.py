"""Countdown puzzles: evolm's own solvable-by-construction generator, and a loader.

Generated records have the fields of the paper's ``countdown.json`` (``id``, ``context``,
``numbers``, ``target``, ``solution``), so either source feeds the same task. The generator
is written from scratch; it shares nothing with the paper's (non-commercial) data but the schema.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from evolm.errors import ConfigError
from evolm.task.base import check_record_size, parse_json, read_jsonl, read_text
from evolm.task.countdown.reward import TOLERANCE, format_target, paper_prompt, parse_target

__all__ = [
    "FIELDS",
    "PuzzleLimits",
    "apply_operator",
    "chain_expression",
    "generate_puzzle",
    "generate_puzzles",
    "load_countdown_json",
    "puzzle_record",
    "solve_chain",
    "tree_records",
]

FIELDS = ("id", "context", "numbers", "target", "solution")
"""The fields of every Countdown record."""

_OPS = "+-*/"
_MAX_ATTEMPTS = 10_000


def _check(ok: bool, key: str, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(key, problem, fix)


def apply_operator(a: Fraction, op: str, b: Fraction) -> Fraction | None:
    """``a op b`` for ``op`` in ``+ - * /``, exactly; ``None`` for a division by zero."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return None if b == 0 else a / b


def _try_tree(
    rng: random.Random,
    numbers: list[int],
    max_intermediate: int,
    max_denominator: int,
) -> tuple[Fraction, str] | None:
    """Combine random pairs of ``numbers`` with random operators until one value is left.

    Returns ``(value, fully parenthesised expression)``, or ``None`` when an intermediate result
    divides by zero, exceeds ``max_intermediate`` in magnitude or has a denominator above
    ``max_denominator``.
    """
    pool: list[tuple[Fraction, str]] = [(Fraction(x), str(x)) for x in numbers]
    while len(pool) > 1:
        i, j = rng.sample(range(len(pool)), 2)  # ordered: the left operand is pool[i]
        (a, a_text), (b, b_text) = pool[i], pool[j]
        op = rng.choice(_OPS)
        value = apply_operator(a, op, b)
        if value is None:
            return None
        if abs(value) > max_intermediate or value.denominator > max_denominator:
            return None
        pool = [p for k, p in enumerate(pool) if k not in (i, j)]
        pool.append((value, f"({a_text} {op} {b_text})"))
    return pool[0]


def chain_expression(numbers: Sequence[int], ops: Sequence[str]) -> str:
    """``numbers`` combined left to right by ``ops``, with only the parentheses precedence needs:
    ``chain_expression([3, 5, 2], "+*")`` is ``"(3 + 5) * 2"``."""
    text, low = str(numbers[0]), False  # low: the text so far ends in a + or - at top level
    for op, x in zip(ops, numbers[1:], strict=True):
        if op in "*/" and low:
            text = f"({text})"
        text, low = f"{text} {op} {x}", op in "+-"
    return text


def solve_chain(
    numbers: Sequence[int], target: str | int | float | Fraction, *, any_order: bool = True
) -> tuple[list[int], str] | None:
    """The first left-to-right chain over ``numbers`` that equals ``target``, or ``None``.

    Chains combine the numbers in the given order first (operators tried in the order
    ``+ - * /`` for each position), then, with ``any_order``, in every other order of the
    numbers (``itertools.permutations`` order). Returns ``(ordered numbers, operators)``, e.g.
    ``([79, 85, 34], "++")``; :func:`chain_expression` writes it out. Exact arithmetic, so a
    chain is found iff one is within the reward's tolerance of the target; not every solvable
    puzzle has a chain (``((a + b) * (c + d))`` is not one).
    """
    goal = parse_target(format_target(target)) if not isinstance(target, Fraction) else target
    orders = itertools.permutations(numbers) if any_order else iter([tuple(numbers)])
    seen: set[tuple[int, ...]] = set()
    for order in orders:
        if order in seen:
            continue
        seen.add(order)
        for ops in itertools.product(_OPS, repeat=len(order) - 1):
            value: Fraction | None = Fraction(order[0])
            for op, x in zip(ops, order[1:], strict=True):
                value = apply_operator(value, op, Fraction(x))
                if value is None:
                    break
            if value is not None and abs(value - goal) < TOLERANCE:
                return list(order), "".join(ops)
    return None


@dataclass(frozen=True)
class PuzzleLimits:
    """What a generated puzzle may be (:func:`generate_puzzles` says what each field means),
    checked at construction: each bad value is a ConfigError naming its key."""

    min_numbers: int = 3
    max_numbers: int = 4
    max_value: int = 100
    max_target: int = 1000
    max_denominator: int = 1
    allow_negative: bool = False

    def __post_init__(self) -> None:
        lo, hi = self.min_numbers, self.max_numbers
        _check(
            2 <= lo <= hi,
            "min_numbers",
            f"need 2 <= min_numbers <= max_numbers, got {lo}..{hi}",
            "use e.g. min_numbers=3, max_numbers=4",
        )
        _check(
            self.max_value >= 2, "max_value", f"must be >= 2, got {self.max_value}", "use e.g. 100"
        )
        _check(
            self.max_target >= 0,
            "max_target",
            f"must be >= 0, got {self.max_target}",
            "use e.g. 1000",
        )
        _check(
            self.max_denominator >= 1,
            "max_denominator",
            f"must be >= 1, got {self.max_denominator}",
            "use 1 for integer-only arithmetic",
        )


def generate_puzzle(
    rng: random.Random, limits: PuzzleLimits = PuzzleLimits()
) -> tuple[list[int], Fraction, str]:
    """One puzzle ``(numbers, exact target, solution)`` drawn from ``rng`` within ``limits``.

    See :func:`generate_puzzles`. Raises ``RuntimeError`` if no puzzle meets the limits within
    10,000 attempts (only with unusually tight limits).
    """
    max_value, max_target = limits.max_value, limits.max_target
    max_intermediate = max(max_target, (max_value - 1) ** 2)
    for _ in range(_MAX_ATTEMPTS):
        count = rng.randint(limits.min_numbers, limits.max_numbers)
        numbers = [rng.randint(1, max_value - 1) for _ in range(count)]
        tree = _try_tree(rng, numbers, max_intermediate, limits.max_denominator)
        if tree is None:
            continue
        value, solution = tree
        if abs(value) > max_target or (value < 0 and not limits.allow_negative):
            continue
        return numbers, value, solution
    raise RuntimeError(
        f"no Countdown puzzle met the constraints in {_MAX_ATTEMPTS} attempts "
        f"(max_target={max_target}, max_denominator={limits.max_denominator}); loosen them"
    )


def generate_puzzles(n: int, seed: int, **limits: Any) -> list[dict[str, Any]]:
    """``n`` Countdown puzzles, solvable by construction; the same ``seed`` gives the same list.

    ``limits`` are keywords, the fields of :class:`PuzzleLimits` (defaults: 3 to 4 numbers,
    ``max_value`` 100, ``max_target`` 1000, ``max_denominator`` 1, no negative targets; each
    checked before any puzzle is drawn).

    Each puzzle draws ``min_numbers``..``max_numbers`` numbers uniformly from
    ``1..max_value - 1`` (the default 100 gives the paper's range 1..99; repeats allowed), then
    builds a random expression tree: it repeatedly combines two random operands with a random
    ``+ - * /``. A tree is rejected when any step divides by zero, leaves a value whose
    denominator exceeds ``max_denominator`` (1, the default, keeps every intermediate an
    integer), or whose magnitude exceeds ``max(max_target, (max_value - 1) ** 2)``; the puzzle is
    rejected when ``|target| > max_target`` or the target is negative and ``allow_negative`` is
    false. Rejected draws are redrawn from the same generator, so output is deterministic.

    Records: ``id`` (0..n-1), ``context`` (:func:`~evolm.task.countdown.reward.paper_prompt`),
    ``numbers`` (list of int, in drawn order), ``target`` (str: integers as ``"98"``, fractions
    as the shortest float repr, e.g. ``"74.75"``, as in the paper's file) and ``solution`` (the
    fully parenthesised tree, e.g. ``"((44 + 19) + 35)"``).
    """
    _check(n >= 0, "n", f"must be >= 0, got {n}", "ask for a non-negative number of puzzles")
    return list(itertools.islice(tree_records(seed, PuzzleLimits(**limits)), n))


def tree_records(seed: int, limits: PuzzleLimits = PuzzleLimits()) -> Iterator[dict[str, Any]]:
    """The endless stream of :func:`generate_puzzles` records (``id`` 0, 1, ...): its first
    ``n`` are ``generate_puzzles(n, seed)`` (with the fields of ``limits``)."""
    rng = random.Random(seed)
    for i in itertools.count():
        numbers, value, solution = generate_puzzle(rng, limits)
        yield puzzle_record(i, numbers, value, solution)


def puzzle_record(
    i: int, numbers: list[int], target: str | int | Fraction, solution: str | None
) -> dict[str, Any]:
    """A Countdown record with the fields of :data:`FIELDS` (``target`` as the file writes it)."""
    text = format_target(target)
    return {
        "id": i,
        "context": paper_prompt(numbers, text),
        "numbers": numbers,
        "target": text,
        "solution": solution,
    }


def load_countdown_json(path: str | Path, key: str = "path") -> list[dict[str, Any]]:
    """Countdown records from a JSON array (the paper's ``countdown.json``) or JSON-lines file.

    Every record needs ``numbers`` (list of int) and ``target`` (str or number); ``id``,
    ``context`` and ``solution`` are filled in when absent (``id`` = position, ``context`` =
    the paper prompt, ``solution`` = ``None``). ``target`` is kept as the file's text, or
    formatted with :func:`~evolm.task.countdown.reward.format_target` when it is a number.
    ``key`` names the config key that pointed here, for error messages.
    """
    p = Path(path).expanduser()
    text = read_text(p, key) if p.is_file() else ""
    raw = _read_array(p, text, key) if text.lstrip().startswith("[") else None
    if raw is None:  # JSON lines (or a missing file): the tasks' common reader and its errors
        raw = read_jsonl(p, key, required=("numbers", "target"))
    records: list[dict[str, Any]] = []
    for pos, rec in enumerate(raw):
        where = f"{p} record {pos}"
        if not isinstance(rec, dict):
            raise ConfigError(key, f"{where} is not a JSON object", "make every record an object")
        numbers = rec.get("numbers")
        if not (
            isinstance(numbers, list)
            and numbers
            and all(isinstance(x, int) and not isinstance(x, bool) for x in numbers)
        ):
            raise ConfigError(
                key,
                f"{where} needs 'numbers' as a non-empty list of integers",
                'give e.g. "numbers": [44, 19, 35]',
            )
        target = rec.get("target")
        if isinstance(target, bool) or not isinstance(target, str | int | float):
            raise ConfigError(
                key, f"{where} needs 'target' as a string or number", 'give e.g. "target": "98"'
            )
        try:
            target_text = format_target(target)
            parse_target(target_text)
        except (ValueError, OverflowError):
            raise ConfigError(
                key,
                f"{where} has a target {target!r} that is not a number",
                'give e.g. "target": "98" or "27.4"',
            ) from None
        out = dict(rec)
        out["id"] = rec.get("id", pos)
        out["target"] = target_text
        out["context"] = rec.get("context") or paper_prompt(numbers, target_text)
        check_record_size(str(out["context"]), f"{where}'s prompt", key)
        out["solution"] = rec.get("solution")
        records.append(out)
    return records


def _read_array(p: Path, text: str, key: str) -> list[Any]:
    """The records of a JSON array file (the paper's ``countdown.json``), or ConfigError."""
    fix = "write a JSON array of records or one JSON object per line"
    raw = parse_json(text, p, 1, key, fix)
    if not raw:
        raise ConfigError(key, f"data file {str(p)!r} holds no records", "add at least one record")
    return raw  # type: ignore[no-any-return]
