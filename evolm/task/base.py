"""The Task protocol: what to prompt, and how to score completions.

A task hands the loop :class:`Example` s and scores completions. ``reward`` is per completion;
a member's fitness is the mean ``reward`` over the prompts it answered (the loop computes it).
Tasks maximise reward.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from evolm.errors import ConfigError
from evolm.sampling import Sampling

Message = Mapping[str, str]


@dataclass(frozen=True)
class Example:
    """One prompt and what its reward needs to know.

    ``prompt`` is raw text (fed verbatim) or chat messages (rendered with the model's chat
    template, then ``assistant_prefix`` is appended after the assistant header).
    """

    prompt: str | Sequence[Message]
    reference: Mapping[str, Any] = field(default_factory=dict)
    assistant_prefix: str = ""
    source: str = ""  # where it comes from, for messages: ``train.jsonl:17``


Scores = dict[str, list[float]]
"""Per-completion scores; the key ``"reward"`` is required, others are logged as task metrics,
except keys that start with ``_`` (per-row data for :meth:`Task.summarize` alone)."""


@runtime_checkable
class Task(Protocol):
    """What the loop needs of a task. Subclass it: the optional hooks have no-op defaults.

    A task may also carry state that a checkpoint keeps (e.g. an adapted multiplier): define
    ``state_dict() -> dict`` and ``load_state_dict(state)`` (:class:`evolm.callbacks.Stateful`).
    """

    sampling: Sampling

    def train_examples(self, generation: int) -> list[Example]:
        """The prompts every member answers in ``generation`` (1-based), deterministic."""
        ...

    def eval_examples(self) -> list[Example]:
        """The held-out prompts the mean is evaluated on."""
        ...

    def score(self, examples: Sequence[Example], completions: Sequence[str]) -> Scores:
        """Scores for ``completions[i]`` answering ``examples[i]`` (one batch, all members)."""
        ...

    # -- optional hooks (no-op defaults) ----------------------------------------------------
    def preflight(self) -> None:
        """Called before any model loads: check what the task needs outside this process (a
        scoring service) and raise :class:`~evolm.errors.ConfigError` naming the key and the
        fix, so a run that cannot score fails in seconds instead of after the model load."""

    row_scores: bool = True
    """Whether a completion's scores depend only on it and its example. True: in a
    distributed run (:mod:`evolm.dist`) each rank scores its own rows and the ranks all-gather
    the scores. False (a reward that compares a member's completions with each other, or a
    batch-dependent scorer): the ranks all-gather the completions, rank 0 scores the whole
    population in one call, as one process does, and broadcasts the scores."""

    def data_stats(self) -> dict[str, float]:
        """Numbers about the task's data (Countdown: ``train_test_overlap``, the eval puzzles
        that are also training puzzles), logged once, in generation 0's record, as
        ``data/<name>``."""
        return {}

    def summarize(self, examples: Sequence[Example], scores: Scores) -> dict[str, float]:
        """Set-level numbers of one evaluation, beyond the per-completion means (countdown: how
        much of the accuracy an answer template explains). ``examples`` and ``scores`` are the
        evaluation's rows, member-major (``examples`` repeats the prompts once per member),
        every rank's in a distributed run. Per-row data only this hook needs travels in score
        keys starting with ``_``, which are never logged. The numbers are logged as
        diagnostics: ``train/<name>`` for the population, ``eval/<name>`` for the mean. Leave
        a number out rather than return NaN (an empty subset)."""
        return {}

    def after_generation(self, scores: Mapping[str, float]) -> dict[str, float]:
        """Called after each generation's ES update with the mean of every score key over all
        its completions (``{"reward": ..., "cost": ...}``). It may adapt task state (the scorer
        task's Lagrange multiplier); the numbers returned are logged as ``train/<name>``."""
        return {}


CHECKED_GENERATIONS = 1000
"""Checks before a run (same data on every rank, prompts that fit the context) look at the
training prompts of at most this many generations."""


def run_examples(task: Task, generations: int) -> Iterator[tuple[int, list[Example]]]:
    """``(0, eval examples)``, then ``(g, train_examples(g))`` for the run's generations (at
    most :data:`CHECKED_GENERATIONS`): the prompts a run of ``generations`` uses."""
    yield 0, task.eval_examples()
    for generation in range(1, min(generations, CHECKED_GENERATIONS) + 1):
        yield generation, task.train_examples(generation)


MAX_RECORD_CHARS = 32_768
"""The longest record (one JSON line, or a Countdown prompt) a data file may hold: prompts
longer than this would stall generation (prefill grows with the square of the length)."""


def read_text(p: Path, key: str) -> str:
    """The UTF-8 text of the data file ``p`` (``key`` names the config key), or ConfigError."""
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            key,
            f"data file {str(p)!r} is not UTF-8 text (byte {e.start}: {e.reason})",
            "save it as UTF-8 (e.g. iconv -f latin1 -t utf-8)",
        ) from None


def check_record_size(text: str, where: str, key: str) -> None:
    """Refuse a record longer than :data:`MAX_RECORD_CHARS` characters."""
    if len(text) > MAX_RECORD_CHARS:
        raise ConfigError(
            key,
            f"{where} is {len(text)} characters long, over the limit of {MAX_RECORD_CHARS} "
            "(a prompt that long would stall generation)",
            "shorten or split that record",
        )


def parse_json(text: str, path: Path, first_line: int, key: str, fix: str) -> Any:
    """``json.loads(text)`` of lines ``first_line...`` of the data file ``path``, or one
    ConfigError naming the file and line: invalid JSON, or an integer of more digits than Python
    converts (``sys.get_int_max_str_digits()``, 4300: json raised a bare ValueError)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        where = f"{path}:{first_line + e.lineno - 1}"
        raise ConfigError(key, f"{where} is not valid JSON ({e.msg})", fix) from None
    except ValueError as e:  # "Exceeds the limit (4300 digits) for integer string conversion"
        limit = sys.get_int_max_str_digits()
        found = re.search(rf"\d{{{limit + 1},}}", text) if limit else None
        if found is None:
            raise ConfigError(key, f"{path}: {e}", fix) from None
        where = f"{path}:{first_line + text.count(chr(10), 0, found.start())}"
        raise ConfigError(
            key,
            f"{where} holds a number of {len(found.group())} digits, more than the {limit} "
            "Python reads",
            "write such a value as a string, or drop it",
        ) from None


def read_jsonl(path: str | Path, key: str, required: Sequence[str]) -> list[dict[str, Any]]:
    """Read a JSON-lines file whose records must carry ``required`` fields.

    ``key`` is the config key that named the file, so errors say what to change.
    """
    return [record for _, record in read_jsonl_lines(path, key, required)]


def read_jsonl_lines(
    path: str | Path, key: str, required: Sequence[str]
) -> list[tuple[str, dict[str, Any]]]:
    """:func:`read_jsonl` with each record's place, ``<file>:<line>``."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(
            key,
            f"data file {str(p)!r} does not exist",
            f"point {key} at a JSON-lines file with fields {list(required)}",
        )
    records = []
    for n, line in enumerate(read_text(p, key).splitlines(), start=1):
        if not line.strip():
            continue
        check_record_size(line, f"{p}:{n}", key)
        rec = parse_json(line, p, n, key, "write one JSON object per line")
        if not isinstance(rec, dict):
            raise ConfigError(
                key,
                f"{p}:{n} is a JSON {type(rec).__name__}, not an object",
                f"write one JSON object per line, with the fields {list(required)}",
            )
        missing = [f for f in required if f not in rec]
        if missing:
            raise ConfigError(
                key,
                f"{p}:{n} lacks field(s) {missing}",
                f"give every record the fields {list(required)}",
            )
        records.append((f"{p}:{n}", rec))
    if not records:
        raise ConfigError(key, f"data file {str(p)!r} holds no records", "add at least one record")
    return records


T = TypeVar("T")


def eval_sampling(task: Task) -> Sampling:
    """How the mean's evaluations decode: the task's ``eval_sampling`` where it has one (e.g.
    greedy evaluations of members that sample), else its ``sampling``."""
    found = getattr(task, "eval_sampling", None)
    return found if isinstance(found, Sampling) else task.sampling


def cycling_window(items: Sequence[T], generation: int, size: int) -> list[T]:
    """The ``generation``-th (1-based) window of ``size`` consecutive items, wrapping around.

    Windows tile an endless repetition of ``items``: with 5 items and ``size=2``, generations
    1, 2, 3, 4 get items ``[0, 1]``, ``[2, 3]``, ``[4, 0]``, ``[1, 2]``.
    """
    if generation < 1:
        raise ValueError(f"generation is 1-based, got {generation}")
    start = (generation - 1) * size
    return [items[(start + j) % len(items)] for j in range(size)]
