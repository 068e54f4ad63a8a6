"""The Countdown reward, implemented from the definitions (no code copied), and the paper prompt.

``reward = 0.1 * format_reward + answer_reward`` (maximum 1.1); see :func:`countdown_reward`.

Decisions where the definitions leave room (all deliberate, all tested):

* **Format** is scored on ``"<think>" + completion`` with ``re.match`` of
  ``^<think>.*?</think>\\n<answer>.*?</answer>$`` (DOTALL). As with any Python ``$`` without
  MULTILINE, one trailing ``"\\n"`` after ``</answer>`` still matches; anything else after it
  (a space, two newlines, text) drops to the partial score 0.1 / 0.5 / 0.6.
* **Whitespace in answers**: the text between the LAST ``<answer>``/``</answer>`` pair is
  ``str.strip()``-ed (so newlines/tabs *around* the expression are fine); inside, only the
  characters ``0-9 + - * / ( )`` and the plain space are allowed. A newline, tab or any other
  whitespace *inside* the expression scores 0, as the paper's character class does.
* **Unary minus/plus** are allowed (``-(3 - 5) * 4``), as evaluating the text as a Python
  expression (what the paper's scripts did) allows them; the digits still have to be exactly
  the puzzle's numbers, so a sign never adds a number.
* **Not accepted** although Python would evaluate them: ``**`` (power) and ``//`` (floor
  division), which are not the "basic arithmetic operations (+, -, *, /)" the prompt allows.
  Integer literals with a leading zero such as ``05`` are malformed, as in Python.
* **Precision**: expressions are evaluated exactly with :class:`fractions.Fraction` by a small
  recursive-descent parser over tokens (never ``eval``/``ast``). The exact value is compared
  with the target (a float) exactly: correct iff ``|value - target| < 1e-5``. Division by zero,
  malformed expressions and nesting deeper than :data:`MAX_DEPTH` score 0 without raising.
* The final ``reward`` is rounded to 6 decimals so that it takes exactly one of the values in
  :data:`REWARD_VALUES` (``0.1 * 0.1`` would otherwise be ``0.010000000000000002``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from fractions import Fraction
from numbers import Integral, Rational

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "FORMAT_VALUES",
    "MAX_DEPTH",
    "REWARD_VALUES",
    "TOLERANCE",
    "answer_reward",
    "answer_value",
    "closeness",
    "closeness_of",
    "countdown_reward",
    "evaluate_expression",
    "extract_answer",
    "format_numbers",
    "format_reward",
    "format_target",
    "paper_prompt",
    "parse_answer",
    "parse_target",
]

TOLERANCE = 1e-5
"""An answer is correct when ``|value - target| < TOLERANCE``."""

MAX_DEPTH = 100
"""Nesting (parentheses plus unary signs) beyond this depth is treated as malformed."""

FORMAT_VALUES = frozenset({0.0, 0.1, 0.5, 0.6, 1.0})
"""Every value :func:`format_reward` can return."""

REWARD_VALUES = frozenset(round(0.1 * f + a, 6) for f in FORMAT_VALUES for a in (0.0, 1.0))
"""Every value the ``"reward"`` of :func:`countdown_reward` can take."""

# The paper's format and answer regexes, ``^<think>.*?</think>\n<answer>.*?</answer>$``,
# ``<think>.*?</think>`` and ``<answer>(.*?)</answer>`` (re.DOTALL), are evaluated with str.find
# below: the same results (tests/test_countdown_reward.py checks them against the regexes,
# kept in benchmarks/score_host.py, on 20,000 random tag soups), 6.9x faster on 6,000 of the
# 1.5B's long completions (0.228 -> 0.033 s for both functions, a 2-core x86-64 CPU), where
# scoring a generation spent most of its time.
_OPEN_THINK, _CLOSE_THINK = "<think>", "</think>"
_OPEN_ANSWER, _CLOSE_ANSWER = "<answer>", "</answer>"
_SEPARATOR = "</think>\n<answer>"
_ALLOWED = re.compile(r"[0-9+\-*/() ]+")
_INTEGER = re.compile(r"[0-9]+")
_TOKEN = re.compile(r"\s*(?:([0-9]+)|(\*\*|//|[-+*/()]))")

_PROMPT = (
    "You are a helpful assistant. You first think about the reasoning process in your mind and "
    "then provide the user with the answer."
    "Using the numbers {numbers}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work in "
    "<think> </think> tags. And return the final answer in <answer> </answer> tags, for example "
    "<answer> (1 + 2) / 3 </answer>."
    "Let me solve this step by step.\n<think>"
)


# --------------------------------------------------------------------------- format


def format_reward(completion: str) -> float:
    """1.0 for ``<think>…</think>\\n<answer>…</answer>``, else 0.1 (think) + 0.5 (answer).

    Scored on ``"<think>" + completion`` because the prompt ends with ``<think>``.
    """
    text = _OPEN_THINK + completion
    if _full_format(text):
        return 1.0
    score = 0.0
    if text.find(_CLOSE_THINK, len(_OPEN_THINK)) >= 0:  # the text starts with <think>
        score += 0.1
    opened = text.find(_OPEN_ANSWER)
    if opened >= 0 and text.find(_CLOSE_ANSWER, opened + len(_OPEN_ANSWER)) >= 0:
        score += 0.5
    return round(score, 6)


def _full_format(text: str) -> bool:
    """``^<think>.*?</think>\\n<answer>.*?</answer>$`` (DOTALL) matches ``text``, which starts
    with ``<think>``: a ``</think>\\n<answer>`` after it (the first is the one that leaves the
    most room), then ``</answer>`` at the end, or before a final newline (``$``)."""
    found = text.find(_SEPARATOR, len(_OPEN_THINK))
    if found < 0:
        return False
    body = found + len(_SEPARATOR)
    for ending in (_CLOSE_ANSWER, _CLOSE_ANSWER + "\n"):
        if text.endswith(ending) and len(text) - len(ending) >= body:
            return True
    return False


# --------------------------------------------------------------------------- answer


def extract_answer(completion: str) -> str | None:
    """The stripped text of the LAST ``<answer>…</answer>`` block, or ``None`` if there is none."""
    last, start = None, 0
    while (opened := completion.find(_OPEN_ANSWER, start)) >= 0:  # re.findall's blocks, in order
        body = opened + len(_OPEN_ANSWER)
        closed = completion.find(_CLOSE_ANSWER, body)
        if closed < 0:
            break
        last, start = completion[body:closed], closed + len(_CLOSE_ANSWER)
    return None if last is None else last.strip()


class _Malformed(Exception):
    """The expression does not parse (internal; never escapes this module)."""


def _tokenize(expr: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    end = len(expr.rstrip())
    while pos < end:
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise _Malformed(f"unexpected character at {pos}")
        number, op = m.group(1), m.group(2)
        if number is not None:
            if len(number) > 1 and number[0] == "0" and number.strip("0"):
                raise _Malformed("leading zero")  # as in Python: "05" is a syntax error
            tokens.append(number)
        else:
            if op in ("**", "//"):
                raise _Malformed(f"operator {op!r} is not allowed")
            tokens.append(op)
        pos = m.end()
    return tokens


class _Parser:
    """expr := term (('+'|'-') term)* ; term := factor (('*'|'/') factor)* ;
    factor := ('+'|'-') factor | NUMBER | '(' expr ')'."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise _Malformed("unexpected end")
        self.pos += 1
        return tok

    def parse(self) -> Fraction:
        value = self.expr()
        if self.peek() is not None:
            raise _Malformed(f"unexpected token {self.peek()!r}")
        return value

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            if self.take() == "+":
                value += self.term()
            else:
                value -= self.term()
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self.peek() in ("*", "/"):
            if self.take() == "*":
                value *= self.factor()
            else:
                divisor = self.factor()
                if divisor == 0:
                    raise ZeroDivisionError("division by zero")
                value /= divisor
        return value

    def factor(self) -> Fraction:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Malformed("nested too deeply")
        tok = self.take()
        if tok == "-":
            value = -self.factor()
        elif tok == "+":
            value = self.factor()
        elif tok == "(":
            value = self.expr()
            if self.take() != ")":
                raise _Malformed("missing ')'")
        elif tok.isdigit():
            value = Fraction(int(tok))
        else:
            raise _Malformed(f"unexpected token {tok!r}")
        self.depth -= 1
        return value


def evaluate_expression(expr: str) -> Fraction | None:
    """The exact value of an arithmetic expression over non-negative integer literals.

    Supports ``+ - * /``, parentheses and unary ``+``/``-`` with the usual precedence. Returns
    ``None`` when the expression is malformed, nested deeper than :data:`MAX_DEPTH`, or divides
    by zero. Whitespace between tokens is skipped; the caller checks the character set.
    """
    try:
        return _Parser(_tokenize(expr)).parse()
    except (_Malformed, ZeroDivisionError):
        return None


def parse_answer(answer: str) -> tuple[list[str], Fraction] | None:
    """The tokens (``"(1 + 2) / 3"`` -> ``["(", "1", "+", ...]``) and exact value of an answer
    text the reward evaluates (its characters allowed, it parses, no division by zero); else
    ``None``. For analyses of answers (:mod:`evolm.task.countdown.shortcuts`), not the reward."""
    if not answer or not _ALLOWED.fullmatch(answer):
        return None
    try:
        tokens = _tokenize(answer)
        return tokens, _Parser(tokens).parse()
    except (_Malformed, ZeroDivisionError):
        return None


def parse_target(s: str | int | float) -> float:
    """A target as a float: ``"98"``, ``"-11"``, ``"27.4"``, ``"266.6666666666667"``, 98, 27.4.

    Raises ``ValueError`` for text that is not a number, ``inf`` or ``nan``, and ``TypeError``
    for anything that is not ``str``/``int``/``float`` (``bool`` included).
    """
    if isinstance(s, bool) or not isinstance(s, str | int | float):
        raise TypeError(f"target must be str, int or float, got {type(s).__name__}")
    value = float(s.strip()) if isinstance(s, str) else float(s)
    if not math.isfinite(value):
        raise ValueError(f"target must be finite, got {s!r}")
    return value


def answer_value(completion: str, numbers: Sequence[int]) -> Fraction | None:
    """The exact value of the last ``<answer>`` when it uses each of ``numbers`` exactly once
    (what the answer reward requires before comparing with the target); else ``None``."""
    return value_of_answer(extract_answer(completion), numbers)


def value_of_answer(answer: str | None, numbers: Sequence[int]) -> Fraction | None:
    """:func:`answer_value` of an answer's text (:func:`extract_answer`'s)."""
    if not answer or not _ALLOWED.fullmatch(answer):
        return None
    used = sorted(int(n) for n in _INTEGER.findall(answer))
    if used != sorted(int(n) for n in numbers):
        return None
    return evaluate_expression(answer)


def answer_reward(completion: str, numbers: Sequence[int], target: float | int | str) -> float:
    """1.0 if the last ``<answer>`` uses each of ``numbers`` exactly once and equals ``target``.

    ``target`` may also be given as the file's string (parsed by :func:`parse_target`).
    """
    return reward_of_value(answer_value(completion, numbers), target)


def reward_of_value(value: Fraction | None, target: float | int | str) -> float:
    """:func:`answer_reward` of an answer's value (:func:`answer_value`'s)."""
    if value is None:
        return 0.0
    goal = Fraction(parse_target(target))  # exact image of the float
    return 1.0 if abs(value - goal) < TOLERANCE else 0.0


def closeness_of(value: ArrayLike, target: ArrayLike) -> np.ndarray:
    """``max(0, 1 - |value - target| / max(|target|, 1))``: 1 at the target, falling linearly
    to 0 at a relative error of 100% (0 for NaN or inf); elementwise over floats or arrays (the
    blind baseline takes a form's over every puzzle at once)."""
    value, target = np.asarray(value, dtype=np.float64), np.asarray(target, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        near = 1.0 - np.abs(value - target) / np.maximum(np.abs(target), 1.0)
    return np.where(np.isfinite(near), np.clip(near, 0.0, None), 0.0)


def closeness(completion: str, numbers: Sequence[int], target: float | int | str) -> float:
    """How near the last ``<answer>`` comes to ``target`` (:func:`closeness_of`), for an answer
    that uses each of ``numbers`` exactly once (else 0): a dense, target-dependent signal where
    the answer reward is 0 or 1 (``task.closeness_weight``; not part of the paper's reward)."""
    return closeness_of_value(answer_value(completion, numbers), target)


def closeness_of_value(value: Fraction | None, target: float | int | str) -> float:
    """:func:`closeness` of an answer's value (:func:`answer_value`'s)."""
    if value is None:
        return 0.0
    try:
        return float(closeness_of(float(value), parse_target(target)))
    except OverflowError:  # a value beyond any float is nowhere near a target
        return 0.0


def countdown_reward(
    completion: str, numbers: Sequence[int], target: float | int | str
) -> dict[str, float]:
    """``{"reward", "format_reward", "answer_reward", "accuracy"}`` for one completion.

    ``reward = 0.1 * format_reward + answer_reward`` (rounded to 6 decimals, max 1.1);
    ``accuracy`` is 1.0 when the answer is correct.
    """
    return paper_scores(format_reward(completion), answer_reward(completion, numbers, target))


def paper_scores(fmt: float, ans: float) -> dict[str, float]:
    """:func:`countdown_reward` from the format and answer rewards."""
    return {
        "reward": round(0.1 * fmt + ans, 6),
        "format_reward": fmt,
        "answer_reward": ans,
        "accuracy": 1.0 if ans > 0 else 0.0,
    }


# --------------------------------------------------------------------------- prompt


def format_numbers(numbers: Sequence[int]) -> str:
    """``numbers`` as ``str(numpy.array(numbers))`` prints them: ``[44 19 35]``, ``[ 2 54 17]``.

    Every element is right-aligned to the widest one and lines wrap as numpy's default width of
    75 characters does (continuation lines start with one space); checked against numpy for
    arrays of up to 80 elements. numpy's ``...`` summary of arrays over 1,000 elements is not
    reproduced (no prompt has that many numbers).
    """
    words = [str(int(n)) for n in numbers]
    if not words:
        return "[]"
    width = max(len(w) for w in words)
    words = [w.rjust(width) for w in words]
    out, line = "", "["
    for i, word in enumerate(words):
        last = i == len(words) - 1
        if len(line) + len(word) > 74 and len(line) > 1:  # 75 columns, less room for "]"/" "
            out += line.rstrip() + "\n"
            line = " "
        line += word if last else word + " "
    return out + line + "]"


def format_target(target: str | int | float | Rational) -> str:
    """A target as the paper's file writes it: integers as ``"98"``/``"-11"``, others as the
    shortest float repr (``"27.4"``, ``"266.6666666666667"``). Strings are returned stripped."""
    if isinstance(target, str):
        return target.strip()
    if isinstance(target, bool):
        raise TypeError("target must not be a bool")
    if isinstance(target, Integral):
        return str(int(target))
    if isinstance(target, Rational):
        if target.denominator == 1:
            return str(int(target))
        return repr(float(target))
    value = float(target)
    if not math.isfinite(value):
        raise ValueError(f"target must be finite, got {target!r}")
    if value.is_integer():
        return str(int(value))
    return repr(value)


def paper_prompt(numbers: Sequence[int], target: str | int | float | Rational) -> str:
    """The paper's verbatim Countdown prompt (no chat template), ending in ``"\\n<think>"``."""
    return _PROMPT.format(numbers=format_numbers(numbers), target=format_target(target))
