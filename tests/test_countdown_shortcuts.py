"""Countdown shortcuts (issue 36): templates, puzzle families, answer shapes, the set-level
numbers of ``Countdown.summarize``, the uniform generator and ``drop_templates``. Pure Python,
no model: the whole file runs in a few seconds."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from evolm.errors import ConfigError
from evolm.task.base import Example
from evolm.task.conciseness import Conciseness
from evolm.task.countdown import Countdown
from evolm.task.countdown.blind import BlindRates, form_tokens
from evolm.task.countdown.data import generate_puzzles
from evolm.task.countdown.reward import closeness, countdown_reward, parse_answer
from evolm.task.countdown.shortcuts import (
    PuzzleInfo,
    answer_shape,
    classify,
    completion_shape,
    solving_patterns,
)
from evolm.task.countdown.solver import reaches, solve
from evolm.task.countdown.sources import template_solvable
from evolm.task.countdown.summary import puzzle_rates

PAPER_FILE = Path(__file__).resolve().parents[1].parent / "shared/data/countdown/countdown.json"

SUM = ([44, 19, 35], "98")  # 44 + 19 + 35
MINUS_PLUS = ([10, 3, 5], "12")  # 10 - 3 + 5
ADDSUB = ([3, 10, 5], "12")  # -3 + 10 + 5: no fixed pattern in this order, a first-negated rule
MULDIV = ([2, 3, 4], "14")  # (3 + 4) * 2
SUM4 = ([1, 2, 3, 4], "10")  # 1 + 2 + 3 + 4, and 1 * 2 * 3 + 4
UNSOLVABLE = ([1, 1, 1], "100")
MINUS_PLUS2 = ([20, 5, 1], "16")  # 20 - 5 + 1
NEGATED = ([5, 4, 3], "2")  # -5 + 4 + 3: no fixed pattern in this order or sorted by size
FREE = ([3, 2, 4], "11")  # 3 + 2 * 4: no fixed rule at all (no chain in any of the three)


def test_templates_and_families_of_hand_made_puzzles() -> None:
    assert classify(*SUM) == PuzzleInfo(3, frozenset({"++"}), "template", frozenset({"r++"}))
    assert classify(*SUM).solved_by("sum") and not classify(*SUM).solved_by("chain_sub")
    minus_plus = classify(*MINUS_PLUS)  # 10 - 3 + 5; largest first: 10 + 5 - 3
    assert minus_plus == PuzzleInfo(3, frozenset({"-+"}), "template", frozenset({"r+-"}))
    assert minus_plus.template_solvable and not minus_plus.solved_by("sum")
    # order matters for the family; the size-order rule 10 + 5 - 3 solves it all the same
    addsub = PuzzleInfo(3, frozenset(), "addsub", frozenset({"r+-"}), frozenset({"n++"}))
    assert classify(*ADDSUB) == addsub  # and the first-negated rule -3 + 10 + 5
    negated = classify(*NEGATED)  # -5 + 4 + 3: only the first number's sign
    assert negated == PuzzleInfo(3, frozenset(), "addsub", frozenset(), frozenset({"n++"}))
    assert negated.rule_solvable and not negated.template_solvable
    assert classify(*FREE).family == "muldiv" and not classify(*FREE).rule_solvable
    assert classify(*SUM4).negated == {"n/+*"}  # (-1 / 2 + 3) * 4
    # (4 + 3) * 2 and 4 * 3 + 2: size-order rules with * (the family is the puzzle order's)
    assert classify(*MULDIV) == PuzzleInfo(3, frozenset(), "muldiv", frozenset({"r+*", "r*+"}))
    assert classify(*UNSOLVABLE) == PuzzleInfo(3, frozenset(), "unsolvable")
    assert classify(*SUM4).patterns == {"+++", "**+"}
    assert solving_patterns([8, 4, 2], "1") == {"//"}  # 8 / 4 / 2, exactly
    assert solving_patterns([6, 0, 2], "3") == {"+/", "-/"}  # 6 / 0: no value, not an error
    assert classify([1, 2, 3, 4, 5, 6], "719").family is None  # too large to search
    assert classify([7, 2], "3.5").family == "template"  # a float target, as the file gives it
    assert classify([7, 3, 9], "-13").family == "addsub"  # 3 - 7 - 9: a negative target


def test_the_solver_uses_every_number_once_and_finds_an_expression() -> None:
    assert reaches([2, 3, 4], "14") is True and reaches([1, 1, 1], "100") is False
    assert reaches([3, 3, 8, 8], "24") is True  # 8 / (3 - 8 / 3): needs a fraction on the way
    found = solve([3, 3, 8, 8], 24)
    assert found is not None
    assert countdown_reward(f"</think>\n<answer>{found}</answer>", [3, 3, 8, 8], 24)["accuracy"]
    assert solve([1, 1, 1], 100) is None


@pytest.mark.parametrize(
    ("answer", "numbers", "form", "template"),
    [
        ("44 + 19 + 35", [44, 19, 35], "a + b + c", True),
        ("35 + 44 + 19", [44, 19, 35], "c + a + b", True),  # a sum in any order
        ("(10 - 3) + 5", [10, 3, 5], "(a - b) + c", True),  # parentheses only left to right
        ("10 - (3 - 5)", [10, 3, 5], "a - (b - c)", False),  # = 12, but not the chain a - b - c
        ("10 - 3 + 5", [3, 10, 5], "b - a + c", True),  # -a + b + c: a first-negated rule
        ("10 + 3 - 5", [3, 10, 5], "b + a - c", False),  # mixed operators, not the given order
        ("(10 - 3) * 5", [3, 10, 5], "(b - a) * c", False),  # -a + b, then not + or -
        ("(10 - 3) + 5", [3, 10, 5], "(b - a) + c", True),  # the same rule, parenthesized
        ("10 - (3 + 5)", [3, 10, 5], "b - (a + c)", False),  # not left to right
        ("((10 - 3) + 5) - 2", [3, 10, 5, 2], "((b - a) + c) - d", True),  # 0.5B's 4-number one
        ("10 - 3", [3, 10], "b - a", True),  # two numbers: -a + b
        ("(10 + 5) - 3", [3, 10, 5], "(b + c) - a", True),  # largest first: a size-order rule
        ("(5 + 10) - 3", [3, 10, 5], "(c + b) - a", False),  # neither order
        ("-3 + 10 + 5", [3, 10, 5], "- a + b + c", False),  # a unary sign
        ("(3 + 4) * 2", [2, 3, 4], "(b + c) * a", False),
        ("2 * 3 * 4", [2, 3, 4], "a * b * c", True),  # a product
        ("(1 + 2) * 3 + 4", [1, 2, 3, 4], "(a + b) * c + d", True),
        ("1 + 2 * 3 + 4", [1, 2, 3, 4], "a + b * c + d", False),  # not (1 + 2) * 3 + 4
        ("5 + 3 + 5", [5, 5, 3], "a + c + b", True),  # repeated numbers take places in turn
        ("1 + 1", [44, 19, 35], "# + #", False),  # numbers the puzzle does not give
    ],
)
def test_template_answers_and_forms(answer: str, numbers: list[int], form: str, template: bool):
    shape = answer_shape(answer, numbers)
    assert shape is not None and (shape.form, shape.template) == (form, template)


def test_answers_that_do_not_parse_have_no_shape() -> None:
    assert completion_shape(" no answer here", [1, 2]) is None
    assert completion_shape("</think>\n<answer> 1 / (2 - 2) </answer>", [1, 2, 2]) is None
    assert completion_shape("<answer>2 ** 3</answer>", [2, 3]) is None
    last = completion_shape("<answer>1 - 2</answer> then <answer> 2 + 1 </answer>", [1, 2])
    assert last is not None and last.form == "b + a"  # the last answer, as the reward reads


def row(numbers: list[int], target: str) -> Example:
    return Example(prompt="", reference={"numbers": numbers, "target": target})


PUZZLES = [SUM, MINUS_PLUS, ADDSUB, MULDIV, SUM4, UNSOLVABLE, MINUS_PLUS2]
MEMBER_0 = [  # right on all but the unsolvable one
    "44 + 19 + 35",
    "10 - 3 + 5",
    "10 - 3 + 5",
    "2 * (3 + 4)",
    "1 + 2 + 3 + 4",
    "1 + 1 + 1",
    "20 - 5 + 1",
]
MEMBER_1 = [  # the sum of the numbers, everywhere (no answer to the unsolvable one)
    "44 + 19 + 35",
    "10 + 3 + 5",
    "3 + 10 + 5",
    "2 + 3 + 4",
    "1 + 2 + 3 + 4",
    None,
    "20 + 5 + 1",
]


def answers(texts: list[str | None]) -> list[str]:
    return [" x" if t is None else f" x </think>\n<answer> {t} </answer>" for t in texts]


@pytest.fixture(scope="module")
def task() -> Countdown:
    return Countdown(train_size=5, generate_count=12, samples_per_generation=2)


def test_summarize_on_a_hand_computed_set(task: Countdown) -> None:
    """Two members (member-major rows) on 7 puzzles; every value worked out by hand."""
    examples = [row(*p) for p in PUZZLES] * 2
    scores = task.score(examples, answers(MEMBER_0) + answers(MEMBER_1))
    assert scores["accuracy"] == [*[1, 1, 1, 1, 1, 0, 1], *[1, 0, 0, 0, 1, 0, 0]]
    out = task.summarize(examples, scores)
    expected = {
        # 3 numbers: "-+" solves 2 puzzles (4 rows), "++" 1; 4 numbers: SUM4 (2 rows)
        "shortcut_accuracy": 6 / 14,
        # largest first: "r+-" solves MINUS_PLUS and ADDSUB (4 rows); SUM4 "r+++" (2 rows)
        "shortcut/by_size": 6 / 14,
        # the first negated: "n++" solves ADDSUB (2 rows); SUM4 "n/+*" (2 rows)
        "shortcut/first_negated": 4 / 14,
        "shortcut/sum": 4 / 14,  # SUM and SUM4
        "shortcut/product": 0.0,
        "shortcut/chain_sub": 0.0,
        "shortcut/chain_div": 0.0,
        "template_solvable_share": 8 / 14,
        "accuracy_beyond_shortcuts": 2 / 6,  # ADDSUB, MULDIV by member 0 of 3 puzzles x 2
        "template_share": 7 / 8,  # of 8 correct answers, member 0's MULDIV is not (its
        # ADDSUB, 10 - 3 + 5, is the first-negated rule -a + b + c)
        # 3 numbers: "a + b + c" 7 of the 11 that parse; 4 numbers: 2 of 2
        "answer_form_top_share": 9 / 13,
        "accuracy/template": 6 / 8,
        "accuracy/addsub": 1 / 2,
        "accuracy/muldiv": 1 / 2,
        "accuracy/n3": 6 / 12,
        "accuracy/n4": 1.0,
        "accuracy/no_rule": 0 / 2,  # UNSOLVABLE: no fixed rule solves it (nor anything)
        # each answer's form on the 6 three-number puzzles (the better of the puzzle's order
        # and largest first) or the one four-number puzzle: member 0 2/6 + 2/6 + 2/6 (a - b + c
        # solves MINUS_PLUS and MINUS_PLUS2; its largest-first form MINUS_PLUS and ADDSUB),
        # 1/6 three times (the sum; a * (b + c)), 1 (SUM4); member 1's sums 1/6 x 5, 1, none 0
        "blind_accuracy": (15 / 6 + 11 / 6) / 14,
        "accuracy_lift": 8 / 14 - (15 / 6 + 11 / 6) / 14,
        "answered_share": 13 / 14,  # member 1 gives no answer to the unsolvable puzzle
        "answer_precision": 8 / 13,  # the 8 right answers of the 13 given
    }
    assert out.keys() == expected.keys()
    assert out == pytest.approx(expected)


def test_no_rule_accuracy_leaves_out_what_any_fixed_rule_solves(task: Countdown) -> None:
    """``accuracy/no_rule``: FREE (3 + 2 * 4) counts; ADDSUB and NEGATED, which no puzzle-order
    template solves (so they count beyond shortcuts) but the size-order rule 10 + 5 - 3 and
    the first-negated rule -5 + 4 + 3 do, do not."""
    examples = [row(*FREE), row(*ADDSUB), row(*FREE), row(*NEGATED)]
    scores = task.score(examples, answers(["3 + 2 * 4", "10 + 5 - 3", "3 * 2 + 4", "4 - 5 + 3"]))
    assert scores["accuracy"] == [1, 1, 0, 1]
    out = task.summarize(examples, scores)
    assert out["accuracy_beyond_shortcuts"] == 3 / 4 and out["accuracy/no_rule"] == 1 / 2
    assert out["shortcut/first_negated"] == 2 / 4  # "n++": ADDSUB and NEGATED


def test_empty_subsets_are_left_out_never_nan(task: Countdown) -> None:
    examples = [row(*SUM), row(*MINUS_PLUS)]  # all template-solvable, nothing answered
    out = task.summarize(examples, task.score(examples, [" x", " y"]))
    given = {"template_share", "answer_form_top_share", "accuracy_beyond_shortcuts"}
    assert not {*given, "answer_precision"} & set(out)
    assert not {"accuracy/addsub", "accuracy/muldiv", "accuracy/n4"} & set(out)
    assert out["accuracy/n3"] == 0.0 and out["answered_share"] == 0.0
    assert all(math.isfinite(v) for v in out.values())
    assert task.summarize([], {"accuracy": [], "_template_answer": [], "_form": []}) == {}


def uniform(seed: int = 0) -> list[tuple[list[int], str]]:
    task = Countdown(
        generator="uniform", target_min=5, target_max=60, seed=seed, train_size=10,
        generate_count=24, samples_per_generation=2, eval_samples=None,
    )  # fmt: skip
    return puzzles(task.train) + puzzles(task.eval)


def puzzles(examples: list[Example]) -> list[tuple[list[int], str]]:
    return [(e.reference["numbers"], e.reference["target"]) for e in examples]


def test_the_uniform_generator_is_deterministic_in_range_and_solvable() -> None:
    drawn = uniform()
    assert drawn == uniform() and drawn != uniform(seed=1)
    assert len(drawn) == 24 and {len(n) for n, _ in drawn} == {3, 4}
    assert all(1 <= x <= 99 for n, _ in drawn for x in n)
    assert all(5 <= int(t) <= 60 for _, t in drawn)
    assert all(reaches(n, t) for n, t in drawn)
    tree = puzzles(Countdown(samples_per_generation=2).train)  # the default: unchanged
    assert tree == [(r["numbers"], r["target"]) for r in generate_puzzles(200, 0)]


@pytest.mark.parametrize("drop", ["train", "test", "both"])
def test_drop_templates_on_generated_splits(drop: str) -> None:
    task = Countdown(
        train_size=30, generate_count=60, samples_per_generation=2, eval_samples=None,
        drop_templates=drop,
    )  # fmt: skip
    plain = Countdown(train_size=30, generate_count=60, samples_per_generation=2, eval_samples=None)
    assert len(task.train) == 30 and len(task.eval) == 30  # dropped puzzles are replaced
    train, test = puzzles(task.train), puzzles(task.eval)
    if drop in ("train", "both"):
        assert not any(template_solvable({"numbers": n, "target": t}) for n, t in train)
    else:
        assert train == puzzles(plain.train)  # a split that drops nothing is unchanged
    if drop in ("test", "both"):
        assert not any(template_solvable({"numbers": n, "target": t}) for n, t in test)
    else:
        assert test == puzzles(plain.eval)


def write_file(path: Path, records: list[tuple[list[int], str]]) -> Path:
    path.write_text("".join(json.dumps({"numbers": n, "target": t}) + "\n" for n, t in records))
    return path


def test_drop_templates_filters_a_data_file(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    data = write_file(tmp_path / "cd.jsonl", [SUM, ADDSUB, MULDIV, SUM, MINUS_PLUS, MULDIV, SUM4])
    with caplog.at_level(logging.WARNING):
        task = Countdown(data_file=str(data), train_size=3, samples_per_generation=1,
                         eval_samples=None, drop_templates="test")  # fmt: skip
    assert puzzles(task.eval) == [MULDIV]  # SUM, MINUS_PLUS, SUM4 dropped
    assert len(task.train) == 3  # the training split is kept whole
    assert f"dropped 3 of the 4 test puzzles of {data}" in caplog.text
    both = Countdown(data_file=str(data), train_size=3, samples_per_generation=None,
                     drop_templates="both")  # fmt: skip
    assert puzzles(both.train) == [ADDSUB, MULDIV]
    # null: every puzzle the split kept, every generation (a count of 3 is refused, naming it)
    assert [puzzles(both.train_examples(g)) for g in (1, 2)] == [[ADDSUB, MULDIV]] * 2
    with pytest.raises(ConfigError) as e:
        Countdown(data_file=str(data), train_size=3, samples_per_generation=3,
                  drop_templates="both")  # fmt: skip
    assert e.value.key == "samples_per_generation"
    with pytest.raises(ConfigError) as e:
        Countdown(data_file=str(data), train_size=6, samples_per_generation=1,
                  drop_templates="test")  # fmt: skip
    assert e.value.key == "drop_templates"  # SUM4, the only test puzzle, is a template


def test_drop_size_rules_also_drops_what_any_fixed_rule_solves(tmp_path: Path) -> None:
    """``drop_size_rules``: ``drop_templates`` also leaves out the puzzles a size-order rule
    (ADDSUB: 10 + 5 - 3, MULDIV: 4 * 3 + 2) or a first-negated one (NEGATED: -5 + 4 + 3)
    solves, in a data file and in generated splits (which keep their sizes); without
    ``drop_templates`` it is a ConfigError naming it."""
    data = write_file(
        tmp_path / "cd.jsonl", [SUM, ADDSUB, FREE, NEGATED, MULDIV, SUM, NEGATED, FREE]
    )

    def task(**kw: object) -> Countdown:
        return Countdown(data_file=str(data), train_size=5, samples_per_generation=None,
                         eval_samples=None, drop_templates="both", **kw)  # fmt: skip

    order, size = task(), task(drop_size_rules=True)
    assert puzzles(order.train) == [ADDSUB, FREE, NEGATED, MULDIV]
    assert puzzles(order.eval) == [NEGATED, FREE]
    assert (puzzles(size.train), puzzles(size.eval)) == ([FREE], [FREE])
    generated = Countdown(
        train_size=30, generate_count=60, samples_per_generation=2, eval_samples=None,
        drop_templates="both", drop_size_rules=True,
    )  # fmt: skip
    kept = puzzles(generated.train) + puzzles(generated.eval)
    assert len(kept) == 60
    assert not any(template_solvable({"numbers": n, "target": t}, True) for n, t in kept)
    with pytest.raises(ConfigError) as e:
        Countdown(samples_per_generation=2, drop_size_rules=True)
    assert e.value.key == "drop_size_rules"


def test_train_n_keeps_the_training_puzzles_of_those_sizes_and_the_test_split(
    tmp_path: Path,
) -> None:
    """``train_n=[3]``: the 3-number training puzzles alone, every one each generation with
    ``samples_per_generation=null``; the test split is the same; a count no training puzzle
    has is a ConfigError naming ``train_n`` before anything loads."""
    data = write_file(tmp_path / "cd.jsonl", [SUM, SUM4, MULDIV, SUM, MINUS_PLUS, MULDIV, SUM4])

    def task(train_n: int | list[int] | None) -> Countdown:
        return Countdown(
            data_file=str(data), train_size=4, samples_per_generation=None, train_n=train_n
        )

    plain, three = task(None), task([3])
    assert puzzles(three.train) == [p for p in puzzles(plain.train) if len(p[0]) == 3]
    assert puzzles(three.train_examples(5)) == [SUM, MULDIV, SUM]
    assert puzzles(task([4]).train) == puzzles(task(4).train) == [SUM4]
    assert puzzles(three.eval) == puzzles(plain.eval) == [MINUS_PLUS, MULDIV, SUM4]
    with pytest.raises(ConfigError) as e:
        Countdown(data_file=str(data), train_size=4, train_n=[5])
    assert e.value.key == "train_n" and "[3, 4]" in str(e.value)


def test_train_family_keeps_the_training_puzzles_of_those_families(tmp_path: Path) -> None:
    """``train_family=[muldiv]``: the training puzzles only ``*`` or ``/`` solve, after
    ``train_n``; the test split is the same; an unknown family, or one no training puzzle is,
    is a ConfigError naming ``train_family``."""
    train = [SUM, ADDSUB, MULDIV, SUM4, UNSOLVABLE]
    data = write_file(tmp_path / "cd.jsonl", [*train, MINUS_PLUS, MULDIV])

    def task(**kw: object) -> Countdown:
        return Countdown(data_file=str(data), train_size=5, samples_per_generation=None, **kw)  # type: ignore[arg-type]

    plain = task()
    assert puzzles(task(train_family=["muldiv"]).train) == [MULDIV]
    assert puzzles(task(train_family="template").train) == [SUM, SUM4]
    assert puzzles(task(train_family=["addsub", "muldiv"]).train) == [ADDSUB, MULDIV]
    assert puzzles(task(train_family=["template"], train_n=[4]).train) == [SUM4]
    assert puzzles(task(train_family=["muldiv"]).eval) == puzzles(plain.eval)
    with pytest.raises(ConfigError) as e:
        task(train_family=["mul"])
    assert e.value.key == "train_family" and "unknown ['mul']" in str(e.value)
    with pytest.raises(ConfigError) as e:  # no 4-number training puzzle needs * or /
        task(train_family=["muldiv"], train_n=[4])
    assert e.value.key == "train_family" and "is ['muldiv']" in str(e.value)


@pytest.mark.parametrize(
    ("kwargs", "bad_key"),
    [
        ({"generator": "trees"}, "generator"),
        ({"drop_templates": "eval"}, "drop_templates"),
        ({"generator": "uniform", "target_min": 50, "target_max": 10}, "target_min"),
        ({"generator": "uniform", "target_min": 10**9, "target_max": 10**9}, "target_min"),
        ({"stop": "</answer>"}, "stop"),  # a string, not a list of them
        ({"stop": ["</answer>"] * 9}, "stop"),
        ({"samples_per_generation": 0}, "samples_per_generation"),
    ],
)
def test_bad_values_name_the_key(kwargs: dict, bad_key: str) -> None:
    with pytest.raises(ConfigError) as e:
        Countdown(**{"train_size": 5, "generate_count": 12, "samples_per_generation": 2, **kwargs})
    assert e.value.key == bad_key


def test_stop_strings_reach_the_sampling_of_both_paper_tasks() -> None:
    task = Countdown(train_size=5, generate_count=12, samples_per_generation=2, stop=["</answer>"])
    assert task.sampling.stop == ("</answer>",)
    assert Conciseness(stop=["\n"]).sampling.stop == ("\n",) and Conciseness().sampling.stop == ()
    with pytest.raises(ConfigError) as e:
        Conciseness(stop="\n")
    assert e.value.key == "stop"


@pytest.mark.skipif(not PAPER_FILE.is_file(), reason="the paper's countdown.json is not here")
def test_the_best_template_on_the_papers_test_split() -> None:
    """In the puzzle's order: 975 3-number puzzles x 20.1% (a - b + c) and 1,025 4-number x
    4.5% (a + b + c - d), 12.1%. Largest first: 28.4% (largest - middle + smallest) and 7.1%
    (the two largest minus the others), 17.5%: what the best fixed rule scores."""
    records = json.loads(PAPER_FILE.read_text())[200:]
    infos = [classify(r["numbers"], r["target"]) for r in records]
    rates = puzzle_rates(infos)
    assert rates["shortcut_accuracy"] == rates["shortcut/by_size"] == (277 + 73) / 2000
    threes = [i for i in infos if i.size == 3]
    assert sum("-+" in i.patterns for i in threes) == 196 and len(threes) == 975
    assert sum("++-" in i.patterns for i in infos if i.size == 4) == 46
    assert sum("r-+" in i.ranked for i in threes) == 277
    assert sum("r+--" in i.ranked for i in infos if i.size == 4) == 73
    in_order = [PuzzleInfo(i.size, i.patterns, i.family) for i in infos]
    assert puzzle_rates(in_order)["shortcut_accuracy"] == (196 + 46) / 2000  # 12.1%
    # the first negated: -a + b + c solves 182 3-number puzzles, 179 of them `+`/`-` ones no
    # template solves (of 233); -a - b + c + d 38 4-number ones
    assert sum("n++" in i.negated for i in threes) == 182
    assert sum("n++" in i.negated for i in threes if i.family == "addsub") == 179
    assert rates["shortcut/first_negated"] == (182 + 38) / 2000
    assert rates["template_solvable_share"] == pytest.approx(0.3915)


def test_answer_forms_use_every_number_once() -> None:
    tokens = parse_answer("(92 + 54) - 48")[0]  # type: ignore[index]
    assert form_tokens(tokens, [48, 92, 54]) == ("(", "#1", "+", "#2", ")", "-", "#0")
    assert form_tokens(tokens, [92, 54, 48]) == ("(", "#0", "+", "#1", ")", "-", "#2")
    assert form_tokens(tokens, [48, 92, 54, 7]) is None  # 7 unused
    assert form_tokens(tokens, [48, 92, 53]) is None  # 54 is not the puzzle's
    assert form_tokens(parse_answer("5 + 5 - 1")[0], [5, 1, 5]) == ("#0", "+", "#2", "-", "#1")  # type: ignore[index]
    rates = BlindRates([([48, 92, 54], 98), ([10, 20, 5], 25), ([3, 4, 5], 60), ([7, 2, 9], 14)])
    # largest + middle - smallest solves 3 of the 4 puzzles; 3 * 4 * 5, the product, 1
    assert rates.of_answer(tokens, [48, 92, 54]) == 0.75
    assert rates.of_answer(parse_answer("3 * 4 * 5")[0], [3, 4, 5]) == 0.25  # type: ignore[index]
    assert rates.of_answer(parse_answer("9 + 7")[0], [7, 2, 9]) == 0.0  # type: ignore[index]
    assert rates.of_answer(None, [7, 2, 9]) == 0.0
    zero = BlindRates([([6, 3, 1], 3), ([2, 5, 5], 0)])  # a / (b - c) divides by 0 on the 2nd
    assert zero.of_answer(parse_answer("6 / (3 - 1)")[0], [6, 3, 1]) == 0.5  # type: ignore[index]
    assert rates.of_answer(parse_answer("1 + 2")[0], [1, 2]) == 0.0  # no puzzle of 2 numbers


def best_fixed_rule(refs: list[dict]) -> list[str]:
    """The best fixed rule's answers (largest - middle + smallest; the two largest minus the
    others): 17.5% of the paper's test puzzles."""
    rule = []
    for r in refs:
        a, b, c, *d = sorted(r["numbers"], reverse=True)
        rule.append(f"{a} - {b} + {c}" if not d else f"{a} + {b} - {c} - {d[0]}")
    return rule


@pytest.mark.skipif(not PAPER_FILE.is_file(), reason="the paper's countdown.json is not here")
def test_a_fixed_rule_has_no_lift_and_a_solver_has_one_on_the_papers_test_split() -> None:
    """Issue 36's runs wrote a few size-order sign rules whatever the puzzle: the blind
    baseline is what exposes any such habit. Answering every puzzle with the best fixed rule
    (largest - middle + smallest; the two largest minus the others) scores 17.5%, and its
    forms written blindly score exactly that: lift 0. The solver's answers score 99.3% (every
    solvable puzzle) while their forms, written blindly, score far less."""
    task = Countdown(data_file=str(PAPER_FILE), train_size=200, eval_samples=None)
    examples = task.eval_examples()
    refs = [e.reference for e in examples]
    rule = best_fixed_rule(refs)
    scores = task.score(examples, answers(rule))
    out = task.summarize(examples, scores)
    assert out["blind_accuracy"] == pytest.approx((277 + 73) / 2000)
    assert out["accuracy_lift"] == pytest.approx(0.0, abs=1e-12)
    # task.blind_baseline=true: the same rule earns nothing beyond its format on average
    corrected = Countdown(
        data_file=str(PAPER_FILE), train_size=200, eval_samples=None, blind_baseline=True
    ).score(examples, answers(rule))
    assert corrected["accuracy"] == scores["accuracy"]
    assert corrected["reward"] == pytest.approx(
        [r - b for r, b in zip(scores["reward"], scores["_blind"], strict=True)]
    )
    assert sum(corrected["reward"]) / 2000 == pytest.approx(0.1, abs=1e-12)  # format 1.0 each
    solved = [solve(r["numbers"], r["target"]) for r in refs]
    out = task.summarize(examples, task.score(examples, answers(solved)))
    assert out["accuracy_lift"] > 0.8 and out["blind_accuracy"] < 0.15


def test_closeness_is_one_at_the_target_and_falls_with_the_relative_error() -> None:
    assert closeness(answers(["3 + 4"])[0], [3, 4], 7) == 1.0
    assert closeness(answers(["3 + 4"])[0], [3, 4], 14) == 0.5  # 7 off a target of 14
    assert closeness(answers(["10 - 1"])[0], [10, 1], "-11") == pytest.approx(0.0)  # 20 off
    assert closeness(answers(["1 - 10"])[0], [10, 1], "-11") == pytest.approx(1 - 2 / 11)
    assert closeness(answers(["3 * 4"])[0], [3, 4], 0) == 0.0  # 12 off a target of 0
    assert closeness(answers(["3 + 3"])[0], [3, 4], 7) == 0.0  # not the puzzle's numbers
    assert closeness(answers(["3 + 4 + 5"])[0], [3, 4], 7) == 0.0  # 5 is not the puzzle's
    assert closeness(answers(["3 / (4 - 4)"])[0], [3, 4, 4], 7) == 0.0  # divides by zero
    assert closeness(answers([None])[0], [3, 4], 7) == 0.0


def test_the_blind_baseline_with_closeness_is_the_forms_blind_mean_score() -> None:
    """(largest + middle) - smallest on 4 puzzles, by hand: in the puzzle's order it solves 1
    with closeness 1, 0.6, 0.1, 2/7 (mean 0.49643); ranked largest first it solves 3
    (closeness 1, 1, 0.1, 1: mean 0.775). The baseline takes the better order's sum."""
    puzzles = [([48, 92, 54], 98), ([10, 20, 5], 25), ([3, 4, 5], 60), ([7, 2, 9], 14)]
    tokens = parse_answer("(92 + 54) - 48")[0]  # type: ignore[index]
    plain, weighted = BlindRates(puzzles), BlindRates(puzzles, closeness_weight=1.0)
    assert plain.baseline(tokens, [48, 92, 54]) == plain.of_answer(tokens, [48, 92, 54]) == 0.75
    assert weighted.of_answer(tokens, [48, 92, 54]) == 0.75  # the metric keeps its meaning
    assert weighted.baseline(tokens, [48, 92, 54]) == pytest.approx(0.75 + 0.775)
    assert weighted.baseline(None, [48, 92, 54]) == 0.0


@pytest.mark.parametrize("key", ["format_weight", "closeness_weight"])
def test_a_negative_reward_weight_is_one_config_error(key: str) -> None:
    with pytest.raises(ConfigError, match=f"task.{key}"):
        Countdown(**{key: -0.1})  # type: ignore[arg-type]


@pytest.mark.skipif(not PAPER_FILE.is_file(), reason="the paper's countdown.json is not here")
def test_a_blind_closeness_reward_pays_a_fixed_rule_nothing_and_the_solver_much() -> None:
    """``task.blind_baseline=true task.closeness_weight=0.5 task.format_weight=0``: every
    completion earns its correctness plus half its closeness, minus what its form earns blindly
    on the same puzzles. A fixed rule written on every test puzzle then earns exactly 0 on
    average (it is its own blind baseline); the solver's answers earn most of their reward."""
    kwargs = {"data_file": str(PAPER_FILE), "train_size": 200, "eval_samples": None}
    shaped = Countdown(**kwargs, blind_baseline=True, closeness_weight=0.5, format_weight=0.0)
    examples = shaped.eval_examples()
    refs = [e.reference for e in examples]
    rule = best_fixed_rule(refs)
    scores = shaped.score(examples, answers(rule))
    assert sum(scores["reward"]) / 2000 == pytest.approx(0.0, abs=1e-9)
    assert 0.3 < sum(scores["closeness"]) / 2000 < 0.9  # the rule lands near many targets
    unshaped = Countdown(**kwargs, closeness_weight=0.5).score(examples, answers(rule))
    assert unshaped["reward"] == pytest.approx(  # 0.1 * format 1.0 + answer + closeness / 2
        [0.1 + a + c / 2 for a, c in zip(scores["accuracy"], scores["closeness"], strict=True)]
    )
    solved = shaped.score(examples, answers([solve(r["numbers"], r["target"]) for r in refs]))
    assert sum(solved["reward"]) / 2000 > 0.8


def test_the_first_negated_rule_is_the_best_on_the_template_free_tree_split() -> None:
    """Dropping the templates from the tree generator's test split leaves puzzles that one
    first-negated rule per size solves 28.5% of (-a + b + c on 3 numbers), where the
    puzzle-order and size-order rules reach 13.0%: what issue 36's 0.5B learned to write."""
    task = Countdown(train_size=200, generate_count=400, samples_per_generation=1,
                     eval_samples=None, drop_templates="test")  # fmt: skip
    infos = [task.puzzle_info(e) for e in task.eval]
    rates = puzzle_rates(infos)
    assert len(infos) == 200 and rates["template_solvable_share"] == 0.0
    assert rates["shortcut_accuracy"] == rates["shortcut/first_negated"] == 57 / 200
    assert rates["shortcut/by_size"] == 26 / 200


def test_the_stats_table_has_a_cell_per_column(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m evolm.task.countdown.stats``: the header names every column a row fills
    (the first-negated column included), and a row's rates are the task's own."""
    from evolm.task.countdown import stats

    assert stats.main(["--header", "--train-size", "20", "--generate-count", "60"]) == 0
    header, rule, *rows = capsys.readouterr().out.strip().splitlines()
    names = [c.strip() for c in header.strip("|").split("|")]
    assert "best first-negated" in names and rule.count("|") == header.count("|")
    assert [r.count("|") for r in rows] == [header.count("|")] * 2
    task = Countdown(train_size=20, generate_count=60, samples_per_generation=1, eval_samples=None)
    rates = puzzle_rates([task.puzzle_info(e) for e in task.eval])
    test_cells = dict(zip(names, (c.strip() for c in rows[1].strip("|").split("|")), strict=True))
    assert test_cells["best first-negated"] == f"{100 * rates['shortcut/first_negated']:.1f}%"
    assert test_cells["best rule"] == f"{100 * rates['shortcut_accuracy']:.1f}%"


def test_train_max_rule_share_thins_the_training_puzzles_a_rule_pays(tmp_path: Path) -> None:
    """``train_max_rule_share``: the most-paid rule loses its last puzzle until no rule solves
    more than the share of a size's training puzzles. NEGATED {n++}, ADDSUB {n++, r+-}, FREE {},
    MULDIV {r+*, r*+}: at 0.5 none is over (n++ 2 of 4); at 0.4 n++ loses ADDSUB; at 0.3 the
    three rules tie at 1 of 3, r+* (the largest name) loses MULDIV, then n++ (1 of 2) NEGATED.
    The test split is unchanged; an emptied split or a share outside (0, 1] is a ConfigError."""
    data = write_file(tmp_path / "cd.jsonl", [NEGATED, ADDSUB, FREE, MULDIV, SUM])

    def task(share: float) -> Countdown:
        return Countdown(data_file=str(data), train_size=4, samples_per_generation=None,
                         eval_samples=None, train_max_rule_share=share)  # fmt: skip

    assert puzzles(task(0.5).train) == [NEGATED, ADDSUB, FREE, MULDIV]
    assert puzzles(task(0.4).train) == [NEGATED, FREE, MULDIV]
    assert puzzles(task(0.3).train) == [FREE] and puzzles(task(0.3).eval) == [SUM]
    # thinned over every family first, then train_family keeps NEGATED alone (the other way
    # round n++ would solve both addsub puzzles, 2 of 2, and nothing would be left)
    addsub = Countdown(data_file=str(data), train_size=4, samples_per_generation=None,
                       train_max_rule_share=0.4, train_family=["addsub"])  # fmt: skip
    assert puzzles(addsub.train) == [NEGATED]
    only_rules = write_file(tmp_path / "rules.jsonl", [NEGATED, ADDSUB, SUM])
    for share, path in ((0.3, only_rules), (0.0, data), (1.5, data)):
        with pytest.raises(ConfigError) as e:
            Countdown(data_file=str(path), train_size=2, samples_per_generation=None,
                      train_max_rule_share=share)  # fmt: skip
        assert e.value.key == "train_max_rule_share"


@pytest.mark.skipif(not PAPER_FILE.is_file(), reason="the paper's countdown.json is not here")
def test_train_max_rule_share_on_the_papers_training_split() -> None:
    """At 0.1 the paper's 200 training puzzles keep 152 (52 of 3 numbers, 100 of 4), and no
    fixed rule solves more than a tenth of either size's; the 2,000 test puzzles stay."""
    task = Countdown(data_file=str(PAPER_FILE), train_max_rule_share=0.1,
                     samples_per_generation=None, eval_samples=None)  # fmt: skip
    infos = [task.puzzle_info(e) for e in task.train]
    assert len(infos) == 152 and len(task.eval) == 2000
    for size, count in ((3, 52), (4, 100)):
        sized = [i for i in infos if i.size == size]
        assert len(sized) == count and puzzle_rates(sized)["shortcut_accuracy"] <= 0.1
    kept = Countdown(data_file=str(PAPER_FILE), train_max_rule_share=0.1, eval_samples=None,
                     train_family=["template", "addsub"], samples_per_generation=None)  # fmt: skip
    rest = [task.puzzle_info(e) for e in kept.train]  # thinned first: the 76 without * or /
    assert len(rest) == 76 and {i.family for i in rest} == {"template", "addsub"}
    signs = [i for i in infos if i.family != "muldiv"]  # every +/- rule pays the same puzzles
    plus_minus = lambda i: {r for r in i.rules if "*" not in r and "/" not in r}  # noqa: E731
    assert [plus_minus(i) for i in rest] == [plus_minus(i) for i in signs]
    full = Countdown(data_file=str(PAPER_FILE), samples_per_generation=None, eval_samples=None)
    threes = [full.puzzle_info(e) for e in full.train if len(e.reference["numbers"]) == 3]
    assert puzzle_rates(threes)["shortcut_accuracy"] > 0.2  # what it thinned
