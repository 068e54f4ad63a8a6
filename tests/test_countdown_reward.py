"""Countdown reward, prompt formatting and puzzle generator (pure Python, no torch)."""

from __future__ import annotations

import json
import random
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from benchmarks.score_host import regex_answer, regex_format
from evolm.errors import ConfigError
from evolm.task.countdown import data as countdown_data
from evolm.task.countdown.data import FIELDS, generate_puzzles, load_countdown_json
from evolm.task.countdown.reward import (
    FORMAT_VALUES,
    MAX_DEPTH,
    REWARD_VALUES,
    answer_reward,
    countdown_reward,
    evaluate_expression,
    extract_answer,
    format_numbers,
    format_reward,
    format_target,
    paper_prompt,
    parse_target,
)

PAPER_FILE = Path(__file__).resolve().parents[1].parent / "shared/data/countdown/countdown.json"

# Reference solutions in the paper's file that use one number twice (and so drop another): their
# arithmetic reaches the target, but they break the "each number exactly once" rule.
PAPER_SOLUTIONS_REUSING_A_NUMBER = frozenset(
    {263, 281, 429, 566, 640, 798, 800, 1085, 1178, 1340, 1444, 1560, 1574, 1847, 1984}
)

NUMS = [44, 19, 35]  # target 98


def wrap(answer: str, reasoning: str = "reasoning") -> str:
    """A completion in the exact format the reward wants (the prompt already opened <think>)."""
    return f"{reasoning}</think>\n<answer>{answer}</answer>"


@pytest.fixture(scope="module")
def paper_records() -> list[dict[str, Any]]:
    if not PAPER_FILE.is_file():
        pytest.skip(f"{PAPER_FILE} is absent")
    records: list[dict[str, Any]] = json.loads(PAPER_FILE.read_text(encoding="utf-8"))
    return records


# --------------------------------------------------------------------------- format reward


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("r</think>\n<answer>1</answer>", 1.0),
        ("</think>\n<answer></answer>", 1.0),  # empty blocks still have the format
        ("line 1\nline 2\n</think>\n<answer>\n44 + 19 + 35\n</answer>", 1.0),
        ("<think>r</think>\n<answer>1</answer>", 1.0),  # a repeated opening tag is just text
        ("r</think>\n<answer>1</answer>\n", 1.0),  # `$` admits one final newline (as in re)
        ("r</think>\n<answer>1</answer>\n\n", 0.6),
        ("r</think>\n<answer>1</answer> ", 0.6),
        ("r</think>\n<answer>1</answer> trailing text", 0.6),
        ("r</think> <answer>1</answer>", 0.6),  # space instead of the newline
        ("r</think>\n\n<answer>1</answer>", 0.6),  # two newlines
        ("r</think><answer>1</answer>", 0.6),  # no newline
        (" r</think>\n<answer>1</answer>", 1.0),  # leading text is inside the think block
        ("r</think>\nso <answer>1</answer>", 0.6),
        ("r</think>\n<answer>1", 0.1),  # unclosed answer
        ("reasoning only</think>", 0.1),
        ("<answer>1</answer>", 0.5),  # never closed the think block
        ("r <answer>1</answer> then </think>", 0.6),
        ("r </answer> <answer> no close", 0.0),
        ("r</answer><answer>", 0.0),  # closing before opening is no block
        ("", 0.0),
        ("plain text", 0.0),
        ("</THINK>\n<ANSWER>1</ANSWER>", 0.0),  # tags are case-sensitive
    ],
)
def test_format_reward(completion: str, expected: float) -> None:
    assert format_reward(completion) == expected
    assert format_reward(completion) in FORMAT_VALUES


# --------------------------------------------------------------------------- answer reward


FRAGMENTS = [
    "<think>", "</think>", "<answer>", "</answer>", "\n", "</think>\n<answer>", "x", " 3 + 4 ",
    "<", ">", "/", "answer", "think", "</answer>\n", "\n\n",
]  # fmt: skip


def test_format_and_answer_are_the_papers_regexes_on_random_tag_soups() -> None:
    """20,000 strings of tags, their fragments, newlines and text (seeded): the str.find
    versions give exactly what the paper's regexes give (its reward script's, kept in
    benchmarks.score_host as the before), every format value included."""
    rng = random.Random(0)
    seen = set()
    for _ in range(20_000):
        text = "".join(rng.choices(FRAGMENTS, k=rng.randrange(0, 12)))
        assert format_reward(text) == regex_format(text), repr(text)
        assert extract_answer(text) == regex_answer(text), repr(text)
        seen.add(format_reward(text))
    assert seen == FORMAT_VALUES


def test_full_marks_total_1_1() -> None:
    scores = countdown_reward(wrap("(44 + 19) + 35"), NUMS, "98")
    assert scores == {"reward": 1.1, "format_reward": 1.0, "answer_reward": 1.0, "accuracy": 1.0}


def test_correct_answer_without_format_still_counts() -> None:
    scores = countdown_reward("<answer>44 + 19 + 35</answer>", NUMS, 98)
    assert scores == {"reward": 1.05, "format_reward": 0.5, "answer_reward": 1.0, "accuracy": 1.0}


def test_wrong_answer_with_format() -> None:
    scores = countdown_reward(wrap("44 + 19 - 35"), NUMS, 98)
    assert scores == {"reward": 0.1, "format_reward": 1.0, "answer_reward": 0.0, "accuracy": 0.0}


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("r</think>\n<answer>1</answer>", 0.1),
        ("r</think> <answer>1</answer>", 0.06),
        ("<answer>1</answer>", 0.05),
        ("r</think>", 0.01),
        ("nothing", 0.0),
    ],
)
def test_partial_totals(completion: str, expected: float) -> None:
    assert countdown_reward(completion, NUMS, 98)["reward"] == expected


def test_last_answer_tag_wins() -> None:
    right, wrong = "44 + 19 + 35", "44 + 19 - 35"
    two = f"r</think>\n<answer>{wrong}</answer> no, <answer>{right}</answer>"
    assert answer_reward(two, NUMS, 98) == 1.0
    two = f"r</think>\n<answer>{right}</answer> no, <answer>{wrong}</answer>"
    assert answer_reward(two, NUMS, 98) == 0.0
    assert extract_answer("<answer> a </answer><answer>\n b\t</answer>") == "b"
    assert extract_answer("no tags") is None


@pytest.mark.parametrize(
    "answer",
    [
        "44 + 19 + 36",  # a wrong number
        "44 + 19 + 35 + 0",  # an extra number
        "44 + 19 * 1 + 35",  # an extra number that keeps the value
        "44 + 19",  # a number missing
        "44 + 44 + 10",  # a number reused, another missing
        "(44 + 19 + 35) * (35 / 35)",  # reused numbers that keep the value
        "4 + 4 + 19 + 35",  # digits split into different numbers
        "4419 + 35",
    ],
)
def test_numbers_must_be_used_exactly_once(answer: str) -> None:
    assert answer_reward(wrap(answer), NUMS, 98) == 0.0


def test_repeated_puzzle_numbers_must_each_be_used() -> None:
    assert answer_reward(wrap("9 * 9 - 1"), [9, 9, 1], 80) == 1.0
    assert answer_reward(wrap("9 * 9"), [9, 9, 1], 81) == 0.0
    assert answer_reward(wrap("9 * 9 * 9 - 649"), [9, 9, 1], 80) == 0.0


@pytest.mark.parametrize(
    "answer",
    [
        "44 + 19 + 35 = 98",
        "44 + 19 + 35.",
        "44 + 19 + 35.0",
        "44 × 19 + 35",
        "x = 44 + 19 + 35",
        "[44 + 19] + 35",
        "44 + 19 + 35 # done",
        "44 + 19 + 35 \\",
        "٤٤ + 19 + 35",  # Arabic-Indic digits are not [0-9]
        "44\u00a0+ 19 + 35",  # a no-break space is not a plain space
        "44 + 19 + 35 ;",
    ],
)
def test_characters_outside_the_allowed_set(answer: str) -> None:
    assert answer_reward(wrap(answer), NUMS, 98) == 0.0


def test_division_by_zero_scores_zero() -> None:
    assert answer_reward(wrap("3 / (5 - 5)"), [5, 5, 3], 0) == 0.0
    assert answer_reward(wrap("(5 - 5) / (3 - 3) + 1"), [5, 5, 3, 3, 1], 1) == 0.0
    assert evaluate_expression("1 / 0") is None
    assert evaluate_expression("0 / 1") == 0


@pytest.mark.parametrize(
    ("numbers", "target", "answer"),
    [
        ([69, 55, 25], "-11", "69 - (55 + 25)"),
        ([71, 15, 4], "74.75", "71 + 15 / 4"),
        ([60, 10, 57, 80], "266.6666666666667", "10 / (60 - 57) * 80"),
        ([99, 86, 76, 97], "-13.307692307692308", "(97 + 76) / (86 - 99)"),
        ([2, 51, 18, 2], "2.833333333333334", "((2 + (51 / 18)) - 2)"),  # float-rounded target
        ([60, 76, 90], -5.625, "(90 / (60 - 76))"),
        ([3, 7], 3 / 7, "3 / 7"),
    ],
)
def test_negative_and_fractional_targets(
    numbers: list[int], target: str | float, answer: str
) -> None:
    assert answer_reward(wrap(answer), numbers, target) == 1.0
    assert countdown_reward(wrap(answer), numbers, target)["reward"] == 1.1


def test_tolerance_is_1e_5() -> None:
    assert answer_reward(wrap("44 + 19 + 35"), NUMS, 98.000009) == 1.0
    assert answer_reward(wrap("44 + 19 + 35"), NUMS, 97.999991) == 1.0
    assert answer_reward(wrap("44 + 19 + 35"), NUMS, 98.00001) == 0.0
    assert answer_reward(wrap("44 + 19 + 35"), NUMS, 98.0001) == 0.0
    assert answer_reward(wrap("3 / 7"), [3, 7], "0.42857") == 1.0  # off by 1.4e-6
    assert answer_reward(wrap("3 / 7"), [3, 7], "0.4285") == 0.0


def test_target_types() -> None:
    for target in ("98", " 98 ", 98, 98.0, "98.0", "9.8e1"):
        assert answer_reward(wrap("44 + 19 + 35"), NUMS, target) == 1.0
    assert answer_reward(wrap("44 + 19 + 35"), (35, 44, 19), 98) == 1.0  # any sequence, any order


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("r</think>\n<answer> 44 + 19 + 35 </answer>", 1.0),
        ("r</think>\n<answer>\n44 + 19 + 35\n</answer>", 1.0),  # stripped around the expression
        ("r</think>\n<answer>\t 44+19+35 \r\n</answer>", 1.0),
        ("r</think>\n<answer>44+19+35</answer>", 1.0),  # spaces are optional
        ("r</think>\n<answer>44   +19+    35</answer>", 1.0),
        ("\n\n  r \n</think>\n<answer>44 + 19 + 35</answer>\n", 1.0),
        ("r</think>\n<answer>44 +\n19 + 35</answer>", 0.0),  # newline inside the expression
        ("r</think>\n<answer>44 +\t19 + 35</answer>", 0.0),  # tab inside the expression
        ("r</think>\n<answer>44 + 19\r+ 35</answer>", 0.0),
        ("r</think>\n<answer>4 4 + 19 + 35</answer>", 0.0),  # a space does not join digits
        ("r</think>\n<answer></answer>", 0.0),
        ("r</think>\n<answer>   </answer>", 0.0),
        ("r</think>\n<answer>\n</answer>", 0.0),
    ],
)
def test_whitespace(completion: str, expected: float) -> None:
    assert answer_reward(completion, NUMS, 98) == expected


@pytest.mark.parametrize(
    "answer",
    [
        "((((44)) + ((19 + 35))))",
        "(((44 + 19) + 35))",
        "44 + (19 + (35))",
        "(" * (MAX_DEPTH // 2) + "44" + ")" * (MAX_DEPTH // 2) + " + 19 + 35",
    ],
)
def test_nested_parentheses(answer: str) -> None:
    assert answer_reward(wrap(answer), NUMS, 98) == 1.0


@pytest.mark.parametrize(
    ("numbers", "target", "answer"),
    [
        ([3, 5, 4], 8, "-(3 - 5) * 4"),
        ([3, 5, 4], 8, "(5 - 3) * 4"),
        ([44, 19, 35], 98, "+44 + 19 + 35"),
        ([44, 19, 35], 98, "44 - -19 + 35"),
        ([44, 19, 35], 98, "44 - (-19 - 35)"),
        ([44, 19, 35], -98, "-44 - 19 - 35"),
        ([44, 19, 35], 98, "--44 + 19 + 35"),
        ([2, 3, 4], -24, "2 * -3 * 4"),
    ],
)
def test_unary_signs_are_allowed(numbers: list[int], target: int, answer: str) -> None:
    assert answer_reward(wrap(answer), numbers, target) == 1.0


@pytest.mark.parametrize(
    "answer",
    [
        "(44 + 19 + 35",  # unbalanced
        "44 + 19 + 35)",
        "((44 + 19) + 35",
        ")44 + 19 + 35(",
        "44 + 19 + 35 +",  # trailing operator
        "44 + 19 + 35 -",
        "44 + 19 + 35 *",
        "* 44 + 19 + 35",  # leading binary operator
        "/44 + 19 + 35",
        "44 + + + 19 + 35 *",
        "44 19 + 35",  # missing operator
        "(44)(19) + 35",  # implicit multiplication
        "44 + 19 + 35 ()",
        "() + 44 + 19 + 35",
        "44 + 19 * * 35",
        "44 ** 1 + 19 + 35",  # power is not a basic operation
        "44 + 19 // 1 + 35",  # nor is floor division
        "044 + 19 + 35",  # leading zero, a syntax error in Python too
        "-",
        "()",
        "(" * 5_000 + "44 + 19 + 35" + ")" * 5_000,  # too deep: 0, never RecursionError
        "-" * 10_000 + "44 + 19 + 35",
    ],
)
def test_malformed_expressions_score_zero(answer: str) -> None:
    assert answer_reward(wrap(answer), NUMS, 98) == 0.0
    assert countdown_reward(wrap(answer), NUMS, 98)["reward"] == 0.1


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("2 + 3 * 4", 14),
        ("(2 + 3) * 4", 20),
        ("2 - 3 - 4", -5),  # left associative
        ("8 / 4 / 2", 1),
        ("8 / (4 / 2)", 4),
        ("2 * 3 / 4", Fraction(3, 2)),
        ("-2 * 3", -6),
        ("2 * -3", -6),
        ("- - 2", 2),
        ("-(2 - 5)", 3),
        ("1 - -1", 2),
        ("10 / 4", Fraction(5, 2)),
        ("1 / 3 + 1 / 3 + 1 / 3", 1),  # exact: no float rounding
        ("0", 0),
        ("00", 0),  # like Python: zeros only may repeat
        ("007", None),
        ("", None),
        ("   ", None),
        ("2 +", None),
        ("(2", None),
        ("2)", None),
        ("2 ** 3", None),
        ("7 // 2", None),
        ("a", None),
    ],
)
def test_evaluate_expression(expr: str, value: Fraction | int | None) -> None:
    assert evaluate_expression(expr) == value


def test_evaluate_expression_matches_random_trees() -> None:
    """Differential test: random trees with known exact values, rendered with random spacing,
    redundant parentheses and unary signs, parse back to the same value."""
    rng = random.Random(1234)

    def build(depth: int) -> tuple[Fraction, str]:
        if depth == 0 or rng.random() < 0.3:
            n = rng.randint(0, 120)
            value, text = Fraction(n), str(n)
        else:
            (a, at), (b, bt) = build(depth - 1), build(depth - 1)
            op = rng.choice("+-*/")
            if op == "/" and b == 0:
                op = "*"
            value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else a}[op]
            sp = rng.choice(["", " ", "  "])
            text = f"({at}{sp}{op}{sp}{bt})"
        if rng.random() < 0.15:
            value, text = -value, f"-{text}" if text.startswith("(") else f"-({text})"
        if rng.random() < 0.1:
            text = f"({text})"
        return value, text

    for _ in range(3_000):
        value, text = build(rng.randint(0, 5))
        assert evaluate_expression(text) == value, text


def test_evaluate_expression_precedence_without_parentheses() -> None:
    rng = random.Random(99)
    for _ in range(2_000):
        nums = [rng.randint(1, 20) for _ in range(rng.randint(1, 6))]
        ops = [rng.choice("+-*") for _ in nums[1:]]
        # Reference: sum of products, computed by hand (no eval).
        terms: list[int] = [nums[0]]
        signs = [1]
        for op, n in zip(ops, nums[1:], strict=True):
            if op == "*":
                terms[-1] *= n
            else:
                terms.append(n)
                signs.append(1 if op == "+" else -1)
        expected = sum(s * t for s, t in zip(signs, terms, strict=True))
        text = str(nums[0]) + "".join(f" {op} {n}" for op, n in zip(ops, nums[1:], strict=True))
        assert evaluate_expression(text) == expected, text


# --------------------------------------------------------------------------- targets


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("98", 98.0),
        ("-11", -11.0),
        ("27.4", 27.4),
        ("266.6666666666667", 266.6666666666667),
        ("-15.727272727272727", -15.727272727272727),
        (" 7 \n", 7.0),
        ("0", 0.0),
        (98, 98.0),
        (-3, -3.0),
        (2.5, 2.5),
    ],
)
def test_parse_target(text: str | int | float, value: float) -> None:
    assert parse_target(text) == value
    assert isinstance(parse_target(text), float)


@pytest.mark.parametrize("bad", ["", "abc", "9 8", "nan", "inf", "-inf", float("nan")])
def test_parse_target_rejects_non_numbers(bad: str | float) -> None:
    with pytest.raises(ValueError):
        parse_target(bad)


@pytest.mark.parametrize("bad", [None, True, [98], Fraction(1, 2)])
def test_parse_target_rejects_other_types(bad: object) -> None:
    with pytest.raises(TypeError):
        parse_target(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("target", "text"),
    [
        (98, "98"),
        (-11, "-11"),
        (98.0, "98"),
        (Fraction(196, 2), "98"),
        (Fraction(299, 4), "74.75"),
        (Fraction(800, 3), "266.6666666666667"),
        (Fraction(-173, 11), "-15.727272727272727"),
        (27.4, "27.4"),
        (" 27.4 ", "27.4"),
        ("2.833333333333334", "2.833333333333334"),
    ],
)
def test_format_target(target: Any, text: str) -> None:
    assert format_target(target) == text


def test_format_target_rejects() -> None:
    with pytest.raises(TypeError):
        format_target(True)
    with pytest.raises(ValueError):
        format_target(float("inf"))


# --------------------------------------------------------------------------- prompt


@pytest.mark.parametrize(
    ("numbers", "text"),
    [
        ([44, 19, 35], "[44 19 35]"),
        ([2, 54, 17], "[ 2 54 17]"),
        ([2, 5, 1, 99], "[ 2  5  1 99]"),
        ([1, 2, 3], "[1 2 3]"),
        ([100, 5], "[100   5]"),
        ([-5, 10], "[-5 10]"),
        ([-50, 7], "[-50   7]"),
        ([7], "[7]"),
        ([], "[]"),
    ],
)
def test_format_numbers(numbers: list[int], text: str) -> None:
    assert format_numbers(numbers) == text


def test_format_numbers_matches_numpy() -> None:
    np = pytest.importorskip("numpy")
    rng = random.Random(5)
    for _ in range(3_000):
        hi = rng.choice([9, 99, 999, 10**6, 10**12])
        lo = rng.choice([0, 1, -hi])
        numbers = [rng.randint(lo, hi) for _ in range(rng.randint(1, 80))]  # wraps past 75 cols
        assert format_numbers(numbers) == str(np.array(numbers, dtype=np.int64)), numbers


def test_paper_prompt_text() -> None:
    expected = (
        "You are a helpful assistant. You first think about the reasoning process in your mind "
        "and then provide the user with the answer.Using the numbers [44 19 35], create an "
        "equation that equals 98. You can use basic arithmetic operations (+, -, *, /) and each "
        "number can only be used once. Show your work in <think> </think> tags. And return the "
        "final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
        "Let me solve this step by step.\n<think>"
    )
    assert paper_prompt([44, 19, 35], "98") == expected
    assert paper_prompt([44, 19, 35], 98) == expected
    assert paper_prompt((44, 19, 35), 98.0) == expected
    assert "equals 74.75. You" in paper_prompt([71, 15, 4], Fraction(299, 4))


# --------------------------------------------------------------------------- the paper's file


def test_paper_file_shape(paper_records: list[dict[str, Any]]) -> None:
    assert len(paper_records) == 2_200
    assert [r["id"] for r in paper_records] == list(range(2_200))
    assert all(set(r) == set(FIELDS) for r in paper_records)


def test_paper_prompt_reproduces_every_context(paper_records: list[dict[str, Any]]) -> None:
    for r in paper_records:
        assert f"numbers {format_numbers(r['numbers'])}, create" in r["context"], r["id"]
        assert paper_prompt(r["numbers"], r["target"]) == r["context"], r["id"]
        # Also from the parsed number: the file writes targets the way format_target does.
        assert paper_prompt(r["numbers"], parse_target(r["target"])) == r["context"], r["id"]


def test_paper_solutions_score_full_marks(paper_records: list[dict[str, Any]]) -> None:
    scored = 0
    reusing: set[int] = set()
    odd_targets_solved = 0
    for r in paper_records:
        if r["solution"] is None:
            continue
        scores = countdown_reward(wrap(r["solution"]), r["numbers"], r["target"])
        value = evaluate_expression(r["solution"])
        assert value is not None, r["id"]
        assert abs(value - Fraction(parse_target(r["target"]))) < 1e-5, r["id"]  # arithmetic ok
        if r["id"] in PAPER_SOLUTIONS_REUSING_A_NUMBER:
            assert scores["reward"] == 0.1, r["id"]  # format only: a number is used twice
            reusing.add(r["id"])
            continue
        assert scores["reward"] == 1.1, r["id"]
        scored += 1
        if not r["target"].isdigit():
            odd_targets_solved += 1
    assert reusing == PAPER_SOLUTIONS_REUSING_A_NUMBER
    assert scored == 2_200 - 19 - len(PAPER_SOLUTIONS_REUSING_A_NUMBER)
    assert odd_targets_solved == 56  # 58 negative/fractional targets, 2 with reused numbers


def test_load_countdown_json_reads_the_paper_file(paper_records: list[dict[str, Any]]) -> None:
    assert load_countdown_json(PAPER_FILE) == paper_records


# --------------------------------------------------------------------------- generator


GENERATOR_SETTINGS: list[dict[str, Any]] = [
    {},
    {"min_numbers": 2, "max_numbers": 6},
    {"max_value": 10, "max_target": 50},
    {"max_denominator": 12, "allow_negative": True},
    {"max_denominator": 100, "max_target": 5000, "min_numbers": 4, "max_numbers": 5},
]


@pytest.mark.parametrize("settings", GENERATOR_SETTINGS)
def test_generated_puzzles_are_solved_by_their_solution(settings: dict[str, Any]) -> None:
    min_n = settings.get("min_numbers", 3)
    max_n = settings.get("max_numbers", 4)
    max_value = settings.get("max_value", 100)
    max_target = settings.get("max_target", 1000)
    max_den = settings.get("max_denominator", 1)
    for seed in range(4):
        for r in generate_puzzles(125, seed, **settings):
            assert set(r) == set(FIELDS)
            numbers, target, solution = r["numbers"], r["target"], r["solution"]
            assert countdown_reward(wrap(solution), numbers, target)["reward"] == 1.1, r
            assert r["context"] == paper_prompt(numbers, target)
            assert min_n <= len(numbers) <= max_n
            assert all(isinstance(x, int) and 1 <= x < max_value for x in numbers)
            value = evaluate_expression(solution)
            assert value is not None
            assert value.denominator <= max_den
            assert target == format_target(value)
            assert abs(value) <= max_target
            if not settings.get("allow_negative", False):
                assert value >= 0
            # Fully parenthesised: one pair per operator, the whole expression in parentheses.
            assert solution.count("(") == solution.count(")") == len(numbers) - 1
            assert solution.startswith("(") and solution.endswith(")")
            assert sorted(
                int(t) for t in solution.replace("(", " ").replace(")", " ").split() if t.isdigit()
            ) == sorted(numbers)


def test_generator_ids_and_sizes() -> None:
    puzzles = generate_puzzles(37, 0)
    assert [p["id"] for p in puzzles] == list(range(37))
    assert generate_puzzles(0, 0) == []


def test_generator_is_deterministic_per_seed() -> None:
    assert generate_puzzles(200, 7) == generate_puzzles(200, 7)
    assert generate_puzzles(200, 7, max_denominator=9) == generate_puzzles(
        200, 7, max_denominator=9
    )
    # A prefix is stable: asking for more puzzles does not change the first ones.
    assert generate_puzzles(300, 7)[:200] == generate_puzzles(200, 7)


def test_generator_differs_across_seeds() -> None:
    solutions = [tuple(p["solution"] for p in generate_puzzles(50, seed)) for seed in range(20)]
    assert len(set(solutions)) == 20
    a, b = generate_puzzles(100, 1), generate_puzzles(100, 2)
    assert sum(x["solution"] == y["solution"] for x, y in zip(a, b, strict=True)) < 5


def test_generator_is_pinned() -> None:
    """Guards against silent changes to the sampling sequence (which would change datasets)."""
    first = generate_puzzles(3, 0)
    assert [(p["numbers"], p["target"], p["solution"]) for p in first] == PINNED_SEED_0


PINNED_SEED_0: list[tuple[list[int], str, str]] = [
    ([79, 85, 34], "198", "(34 + (85 + 79))"),
    ([90, 29, 6], "125", "(29 + (6 + 90))"),
    ([94, 8, 87], "15", "((94 + 8) - 87)"),
]


def test_generator_covers_the_paper_kinds_of_targets() -> None:
    puzzles = generate_puzzles(400, 3, max_denominator=20, allow_negative=True)
    targets = [parse_target(p["target"]) for p in puzzles]
    assert any(t < 0 for t in targets)
    assert any(not t.is_integer() for t in targets)
    assert any(t > 100 for t in targets)
    ops = "".join(p["solution"] for p in puzzles)
    assert all(op in ops for op in (" + ", " - ", " * ", " / "))
    plain = generate_puzzles(400, 3)
    assert all(p["target"].isdigit() for p in plain)  # defaults: non-negative integers only


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"n": -1}, "n"),
        ({"min_numbers": 1}, "min_numbers"),
        ({"min_numbers": 5, "max_numbers": 4}, "min_numbers"),
        ({"max_value": 1}, "max_value"),
        ({"max_target": -1}, "max_target"),
        ({"max_denominator": 0}, "max_denominator"),
    ],
)
def test_generator_rejects_bad_settings(kwargs: dict[str, Any], key: str) -> None:
    args = {"n": 3, "seed": 0, **kwargs}
    with pytest.raises(ConfigError) as info:
        generate_puzzles(**args)
    assert info.value.key == key


def test_generator_gives_up_on_impossible_constraints(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: object) -> None:
        return None

    monkeypatch.setattr(countdown_data, "_try_tree", never)
    monkeypatch.setattr(countdown_data, "_MAX_ATTEMPTS", 50)
    with pytest.raises(RuntimeError, match="loosen"):
        generate_puzzles(1, 0)


# --------------------------------------------------------------------------- loader


def test_load_countdown_json_lines_fills_defaults(tmp_path: Path) -> None:
    path = tmp_path / "puzzles.jsonl"
    lines = [
        {"numbers": [44, 19, 35], "target": 98},
        {"numbers": [71, 15, 4], "target": 74.75, "solution": "(71 + (15 / 4))", "id": 9},
        {"numbers": [3, 5], "target": "-2", "extra": "kept"},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n", encoding="utf-8")
    records = load_countdown_json(path)
    assert [r["id"] for r in records] == [0, 9, 2]
    assert [r["target"] for r in records] == ["98", "74.75", "-2"]
    assert records[0]["context"] == paper_prompt([44, 19, 35], "98")
    assert records[0]["solution"] is None
    assert records[2]["extra"] == "kept"


def test_load_countdown_json_roundtrips_generated(tmp_path: Path) -> None:
    puzzles = generate_puzzles(50, 11, max_denominator=7, allow_negative=True)
    path = tmp_path / "gen.json"
    path.write_text(json.dumps(puzzles), encoding="utf-8")
    assert load_countdown_json(path) == puzzles


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("", "no records"),
        ("[]", "no records"),
        ("[1, 2]", "not a JSON object"),
        ('{"numbers": [1, 2], "target": 3}\n{bad', "not valid JSON"),
        ('[{"target": "3"}]', "numbers"),
        ('[{"numbers": [], "target": "3"}]', "numbers"),
        ('[{"numbers": [1, 2.5], "target": "3"}]', "numbers"),
        ('[{"numbers": [1, true], "target": "3"}]', "numbers"),
        ('[{"numbers": [1, 2]}]', "target"),
        ('[{"numbers": [1, 2], "target": null}]', "target"),
        ('[{"numbers": [1, 2], "target": "three"}]', "not a number"),
        ('[{"numbers": [1, 2], "target": "nan"}]', "not a number"),
    ],
)
def test_load_countdown_json_errors(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=problem) as info:
        load_countdown_json(path, key="data.path")
    assert info.value.key == "data.path"


def test_load_countdown_json_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_countdown_json(tmp_path / "nope.json")


# --------------------------------------------------------------------------- fuzz


FUZZ_PIECES = [
    "<think>", "</think>", "<answer>", "</answer>", "<answer", "answer>", "</", "<", ">",
    "\n", " ", "\t", "\r\n", "(", ")", "((", "))", "+", "-", "*", "/", "**", "//", "=",
    "0", "1", "44", "19", "35", "98", "00", "007", "9" * 30, ".", "e", "x", "ß", "٤", "\u00a0",
    "reasoning", "Let me", "\x00",
]  # fmt: skip


def _check_scores(scores: dict[str, float]) -> None:
    assert set(scores) == {"reward", "format_reward", "answer_reward", "accuracy"}
    assert scores["format_reward"] in FORMAT_VALUES
    assert scores["answer_reward"] in (0.0, 1.0)
    assert scores["accuracy"] == scores["answer_reward"]
    assert scores["reward"] in REWARD_VALUES
    assert scores["reward"] == round(0.1 * scores["format_reward"] + scores["answer_reward"], 6)


def test_reward_values_set() -> None:
    assert {0.0, 0.01, 0.05, 0.06, 0.1, 1.0, 1.01, 1.05, 1.06, 1.1} == REWARD_VALUES


def test_fuzz_random_strings_never_raise() -> None:
    rng = random.Random(20251121)
    for _ in range(6_000):
        text = "".join(rng.choice(FUZZ_PIECES) for _ in range(rng.randint(0, 40)))
        _check_scores(countdown_reward(text, NUMS, rng.choice(["98", "-11", "27.4", 0, 2.5])))
    for _ in range(2_000):  # raw characters, control codes included
        text = "".join(chr(rng.randint(0, 0x2FFF)) for _ in range(rng.randint(0, 60)))
        _check_scores(countdown_reward(text, NUMS, 98))


def test_fuzz_random_expressions_with_the_right_numbers() -> None:
    """Random token soups built from exactly the puzzle's numbers: they get past the character
    and number checks, so the parser sees all sorts of malformed and valid input."""
    rng = random.Random(7)
    hits = 0
    for _ in range(8_000):
        numbers = [rng.randint(1, 99) for _ in range(rng.randint(2, 4))]
        parts: list[str] = []
        for n in rng.sample(numbers, len(numbers)):
            parts += rng.choices(["(", "-", "+", " ", ""], k=rng.randint(0, 3))
            parts.append(str(n))
            parts += rng.choices([")", " ", ""], k=rng.randint(0, 2))
            parts.append(rng.choice(["+", "-", "*", "/"] * 5 + [" ", "", "**", "//", ")("]))
        if rng.random() < 0.9:
            parts.pop()  # usually no trailing operator
        answer = "".join(parts)
        value = evaluate_expression(answer)
        target: float = float(value) if value is not None and rng.random() < 0.5 else 98.0
        scores = countdown_reward(wrap(answer), numbers, target)
        _check_scores(scores)
        digits_ok = sorted(int(d) for d in re.findall("[0-9]+", answer)) == sorted(numbers)
        if value is None or not digits_ok:
            assert scores["reward"] == 0.1, answer
        elif target == float(value):
            assert scores["reward"] == 1.1, answer
            hits += 1
    assert hits > 100  # the soup does produce valid expressions too
