"""Countdown shortcuts: answers that need no solving, and what kind of puzzle each one is.

A model can raise countdown accuracy without solving anything (issue 36: a Qwen 0.5B answered
every puzzle with the sum of its numbers and scored 18% on evolm's generator, where 18% of the
puzzles are sums). This module makes such shortcuts visible; exact arithmetic throughout
(:class:`fractions.Fraction`), the reward's tolerance (|value - target| < 1e-5).

* A **template** is an answer computable from the puzzle's numbers alone, never the target: a
  left-to-right chain over the numbers in the order the puzzle gives them, with a FIXED operator
  pattern (a string of ``n - 1`` operators: ``"++"`` is ``a + b + c``, ``"-+"`` is
  ``a - b + c``). The named ones (:data:`TEMPLATES`): ``sum`` (all ``+``), ``product`` (all
  ``*``), ``chain_sub`` (all ``-``), ``chain_div`` (all ``/``). A model can use a different fixed
  pattern per puzzle size, so the best template's accuracy on a set of puzzles is the best
  pattern per size, weighted by the sizes' counts
  (:func:`~evolm.task.countdown.summary.puzzle_rates`).
* A **size-order rule** is the same kind of chain over the numbers sorted largest first (``"r-+"``:
  largest - middle + smallest, which solves 28% of the paper's 3-number test puzzles): also
  computable from the puzzle alone. Issue 36's 1.5B learned to write ``(x + y) - z - w`` with the
  numbers ranked by size, and answered about as often right as the rule it wrote scores on every
  puzzle, so the best fixed rule of any kind (this, the puzzle's order, or the first-negated rules
  below) is what ``shortcut_accuracy`` reports. Puzzle families and ``template_solvable`` stay with
  the puzzle's order (every ``+``/``-`` puzzle is some size-order chain: choosing the signs per
  puzzle is solving it).
* A **first-negated rule** is a chain over the numbers in the puzzle's order with the first
  number negated (``"n++"``: ``-a + b + c``, written ``(b - a) + c``). With the in-order
  patterns it makes every fixed choice of signs a rule, and it is what issue 36's 0.5B wrote
  most on the template-free held-out sets (session 37): ``-a + b + c`` alone solves 42 of the
  112 3-number puzzles of the tree generator's template-free held-out set of the outside
  checks (docs/results/countdown-paper-split/). It counts in
  ``shortcut_accuracy`` like a size-order rule, not in the families.
* Every puzzle is in one **family** (:data:`FAMILIES`): ``template`` (some fixed pattern solves
  it), ``addsub`` (no template does, but ``+``/``-`` alone do, any order), ``muldiv`` (solvable,
  but only with ``*`` or ``/``), ``unsolvable`` (no expression over all its numbers reaches the
  target: :mod:`evolm.task.countdown.solver`); ``None`` for puzzles too large to search.
* An answer is a **template answer** when it uses the numbers in the puzzle's order, only binary
  operators, and its value is the left-to-right chain of its operators (parentheses only enforcing
  left to right: ``(a + b) * c``), or when all its operators are ``+`` (or all ``*``), in any order,
  or the numbers largest first with their left-to-right chain (a size-order rule), or ``(b - a)
  ...`` with ``+``/``-`` only (a first-negated rule). Its **form** is the answer with each number
  replaced by its place in the puzzle (``"a - b + c"``, ``"(c + a) * b"``): how many answers share
  one form shows a model that writes one form for everything.

Set-level numbers: :mod:`evolm.task.countdown.summary`; the rates of a data set:
``python -m evolm.task.countdown.stats`` (docs/tasks.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from evolm.task.countdown.data import apply_operator
from evolm.task.countdown.reward import TOLERANCE, extract_answer, parse_answer, parse_target
from evolm.task.countdown.solver import reaches, reaches_by_signs

__all__ = [
    "FAMILIES",
    "TEMPLATES",
    "AnswerShape",
    "PuzzleInfo",
    "answer_shape",
    "chain_values",
    "classify",
    "completion_shape",
    "form_code",
    "negated_patterns",
    "placed",
    "ranked_patterns",
    "rule_kinds",
    "solving_patterns",
]

TEMPLATES = {"sum": "+", "product": "*", "chain_sub": "-", "chain_div": "/"}
"""The named templates and the operator each repeats."""

FAMILIES = ("template", "addsub", "muldiv", "unsolvable")
"""The puzzle families, a partition (see the module doc)."""

_OPS = "+-*/"
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def chain_values(numbers: Sequence[int]) -> dict[str, Fraction]:
    """The value of every fixed operator pattern over ``numbers`` in their order, left to right:
    ``{"++": a + b + c, "+-": a + b - c, ..., "//": a / b / c}`` (a pattern that divides by zero
    is left out; one number: ``{"": a}``)."""
    level = {"": Fraction(numbers[0])}
    for x in numbers[1:]:
        b = Fraction(x)
        level = {
            pattern + op: value
            for pattern, a in level.items()
            for op in _OPS
            if (value := apply_operator(a, op, b)) is not None
        }
    return level


def solving_patterns(numbers: Sequence[int], target: str | float) -> frozenset[str]:
    """The fixed operator patterns whose chain over ``numbers`` reaches ``target``."""
    goal = Fraction(parse_target(target))
    return frozenset(p for p, v in chain_values(numbers).items() if abs(v - goal) < TOLERANCE)


RANKED = "r"
"""The prefix of a size-order rule's pattern (``"r-+"``)."""


def ranked_patterns(numbers: Sequence[int], target: str | float) -> frozenset[str]:
    """The size-order rules that reach ``target``: fixed patterns over ``numbers`` sorted
    largest first, each prefixed :data:`RANKED`."""
    ordered = sorted(numbers, reverse=True)
    return frozenset(RANKED + p for p in solving_patterns(ordered, target))


NEGATED = "n"
"""The prefix of a first-negated rule's pattern (``"n++"``: ``-a + b + c``)."""


def negated_patterns(numbers: Sequence[int], target: str | float) -> frozenset[str]:
    """The first-negated rules that reach ``target``: fixed patterns over ``numbers`` in their
    order with the first number negated, each prefixed :data:`NEGATED`."""
    return frozenset(NEGATED + p for p in solving_patterns([-numbers[0], *numbers[1:]], target))


def rule_kinds(
    numbers: Sequence[int], target: str | float
) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """Every fixed rule that reaches ``target``, by kind: the patterns over ``numbers`` in their
    order, the size-order rules and the first-negated rules (:class:`PuzzleInfo`'s fields)."""
    return (
        solving_patterns(numbers, target),
        ranked_patterns(numbers, target),
        negated_patterns(numbers, target),
    )


@dataclass(frozen=True)
class PuzzleInfo:
    """What one puzzle is: its size, the fixed patterns that solve it, its family."""

    size: int
    patterns: frozenset[str]
    family: str | None  # one of FAMILIES; None: not searched (too many numbers)
    ranked: frozenset[str] = frozenset()  # the size-order rules that solve it (``"r-+"``)
    negated: frozenset[str] = frozenset()  # the first-negated rules that solve it (``"n++"``)

    @property
    def template_solvable(self) -> bool:
        """Some fixed operator pattern solves the puzzle."""
        return bool(self.patterns)

    @property
    def rule_solvable(self) -> bool:
        """Some fixed rule solves the puzzle: a pattern in its order, a size-order rule or a
        first-negated rule (``task.drop_size_rules`` drops such puzzles; ``accuracy/no_rule``
        is on the others)."""
        return bool(self.patterns or self.ranked or self.negated)

    @property
    def rules(self) -> frozenset[str]:
        """Every fixed rule that solves the puzzle: patterns, size-order and first-negated."""
        return self.patterns | self.ranked | self.negated

    def solved_by(self, template: str) -> bool:
        """Whether the named template (:data:`TEMPLATES`) solves the puzzle."""
        return TEMPLATES[template] * (self.size - 1) in self.patterns


def classify(numbers: Sequence[int], target: str | float) -> PuzzleInfo:
    """The :class:`PuzzleInfo` of one puzzle (the exhaustive search runs only when neither a
    template nor ``+``/``-`` alone solve it)."""
    patterns, ranked, negated = rule_kinds(numbers, target)
    goal = Fraction(parse_target(target))
    family: str | None
    if patterns:
        family = "template"
    elif reaches_by_signs(numbers, goal):
        family = "addsub"
    else:
        solvable = reaches(numbers, goal)
        family = None if solvable is None else "muldiv" if solvable else "unsolvable"
    return PuzzleInfo(len(numbers), patterns, family, ranked, negated)


@dataclass(frozen=True)
class AnswerShape:
    """How an answer is written: its form (numbers replaced by their places in the puzzle,
    ``"a - b + c"``) and whether it is a template answer (see the module doc)."""

    form: str
    template: bool
    tokens: tuple[str, ...] = ()  # the answer's tokens (reward.parse_answer)


def completion_shape(completion: str, numbers: Sequence[int]) -> AnswerShape | None:
    """The shape of a completion's last ``<answer>``; ``None`` when it has none that parses."""
    answer = extract_answer(completion)
    return None if answer is None else answer_shape(answer, numbers)


def answer_shape(answer: str, numbers: Sequence[int]) -> AnswerShape | None:
    """The shape of an answer text (``"44 + 19 + 35"``); ``None`` when the reward could not
    evaluate it (characters, syntax, a division by zero)."""
    parsed = parse_answer(answer)
    if parsed is None:
        return None
    tokens, value = parsed
    return AnswerShape(_form(tokens, numbers), _is_template(tokens, value, numbers), tuple(tokens))


def placed(tokens: Sequence[str], numbers: Sequence[int]) -> list[str | int]:
    """``tokens`` with each number replaced by its place in ``numbers`` (the first unused place
    holding that value; ``-1``: a number the puzzle does not give, or gives fewer times)."""
    free = list(range(len(numbers)))
    out: list[str | int] = []
    for tok in tokens:
        if tok.isdigit():
            place = next((i for i in free if numbers[i] == int(tok)), -1)
            if place >= 0:
                free.remove(place)
            out.append(place)
        else:
            out.append(tok)
    return out


def _form(tokens: Sequence[str], numbers: Sequence[int]) -> str:
    """``tokens`` with each number replaced by the letter of its place in ``numbers``
    (:func:`placed`; ``#``: a number the puzzle does not give)."""
    out = [tok if isinstance(tok, str) else _letter(tok) for tok in placed(tokens, numbers)]
    return " ".join(out).replace("( ", "(").replace(" )", ")")


def _letter(place: int) -> str:
    if place < 0:
        return "#"
    return _LETTERS[place] if place < len(_LETTERS) else f"x{place}"


def _is_template(tokens: Sequence[str], value: Fraction, numbers: Sequence[int]) -> bool:
    """Whether the answer of ``tokens`` (worth ``value``) is a template answer for the puzzle of
    ``numbers``."""
    found: list[int] = []
    ops: list[str] = []
    previous = None
    for tok in tokens:
        if tok.isdigit():
            found.append(int(tok))
        elif tok in _OPS:
            if previous is None or previous == "(" or previous in _OPS:
                return False  # a unary sign: not a chain over the numbers
            ops.append(tok)
        previous = tok
    if sorted(found) != sorted(numbers):
        return False
    if len(set(ops)) <= 1 and set(ops) <= {"+", "*"}:
        return True  # a sum or a product, in any order
    swapped = [*numbers[1:2], *numbers[:1], *numbers[2:]]  # (b - a) ...: a first-negated rule
    first_negated = found == swapped and ops[:1] == ["-"] and set(ops) <= {"+", "-"}
    if found not in (list(numbers), sorted(numbers, reverse=True)) and not first_negated:
        return False
    chain: Fraction | None = Fraction(found[0])
    for op, x in zip(ops, found[1:], strict=True):
        chain = None if chain is None else apply_operator(chain, op, Fraction(x))
    return chain == value


def form_code(form: str) -> float:
    """A form as a number that travels with the scores: a 52-bit hash, exact in a float."""
    digest = hashlib.blake2b(form.encode(), digest_size=8).digest()
    return float(int.from_bytes(digest, "big") >> 12)
