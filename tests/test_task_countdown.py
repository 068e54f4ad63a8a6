"""The Countdown task: splits, cycling training windows, prompts, scoring, config errors."""

from __future__ import annotations

import json
import operator
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from evolm.errors import ConfigError
from evolm.task import Task
from evolm.task.base import cycling_window
from evolm.task.countdown import ASSISTANT_PREFIX, SYSTEM_PROMPT, Countdown
from evolm.task.countdown.data import generate_puzzles
from evolm.task.countdown.reward import countdown_reward, paper_prompt
from evolm.task.countdown.shots import SHOTS

PAPER_FILE = Path(__file__).resolve().parents[1].parent / "shared/data/countdown/countdown.json"
CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def small(**kwargs: object) -> Countdown:
    args: dict = {"train_size": 5, "generate_count": 12, "samples_per_generation": 2}
    return Countdown(**{**args, **kwargs})


def key(example: object) -> tuple:
    ref = example.reference  # type: ignore[attr-defined]
    return tuple(ref["numbers"]), ref["target"]


def test_is_a_task_with_paper_decoding() -> None:
    task = Countdown()
    assert isinstance(task, Task)
    assert task.sampling.max_new_tokens == 1024 and task.sampling.temperature == 0.0
    assert len(task.train) == 200 and len(task.eval_examples()) == 32


def test_cycling_windows_wrap_around() -> None:
    assert [cycling_window("abcde", g, 2) for g in (1, 2, 3, 4, 5, 6)] == [
        ["a", "b"],
        ["c", "d"],
        ["e", "a"],
        ["b", "c"],
        ["d", "e"],
        ["a", "b"],
    ]
    assert cycling_window("abc", 1, 3) == ["a", "b", "c"] == cycling_window("abc", 2, 3)
    with pytest.raises(ValueError):
        cycling_window("abc", 0, 1)


def test_train_windows_cycle_through_training_split() -> None:
    task = small()
    train = [key(e) for e in task.train]
    windows = [[key(e) for e in task.train_examples(g)] for g in range(1, 7)]
    assert windows[0] == train[0:2] and windows[1] == train[2:4]
    assert windows[2] == [train[4], train[0]]  # wraps around
    assert windows[5] == windows[0]  # period: 5 windows of 2 over 5 items
    assert task.train_examples(3) == task.train_examples(3)  # deterministic


def test_generated_split_is_deterministic() -> None:
    records = generate_puzzles(12, 0)
    task = small()
    assert [key(e) for e in task.train] == [(tuple(r["numbers"]), r["target"]) for r in records[:5]]
    assert [key(e) for e in task.eval_examples()] == [
        (tuple(r["numbers"]), r["target"]) for r in records[5:]
    ]
    assert [key(e) for e in small(seed=1).train] != [key(e) for e in task.train]


def test_eval_samples() -> None:
    assert len(small(eval_samples=3).eval_examples()) == 3
    assert len(small(eval_samples=None).eval_examples()) == 7  # all
    assert len(small(eval_samples=100).eval_examples()) == 7  # clamped
    assert small(eval_samples=3).eval_examples() == small().eval_examples()[:3]


def test_verbatim_paper_prompt() -> None:
    example = small().train[0]
    ref = example.reference
    assert example.prompt == paper_prompt(ref["numbers"], ref["target"])
    assert isinstance(example.prompt, str) and example.prompt.endswith("step.\n<think>")
    assert example.assistant_prefix == ""


def test_chat_variant() -> None:
    plain, chat = small().train[0], small(chat_template=True).train[0]
    system, user = chat.prompt  # type: ignore[misc]
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    assert system["content"] == (
        "You are a helpful assistant. You first think about the reasoning process in your mind "
        "and then provide the user with the answer."
    )
    assert user["role"] == "user" and user["content"].startswith("Using the numbers [")
    assert user["content"].endswith("<answer> (1 + 2) / 3 </answer>.")
    assert chat.assistant_prefix == ASSISTANT_PREFIX == "Let me solve this step by step.\n<think>"
    assert SYSTEM_PROMPT + user["content"] + ASSISTANT_PREFIX == plain.prompt


@pytest.mark.parametrize("shots", [1, 2, 3])
def test_shots_come_first_as_turns_that_solve_their_own_examples(shots: int) -> None:
    """``shots=N``: N worked examples between the system message and the puzzle, each a user
    turn in the paper's prompt and an assistant turn (prefix, then a reply that scores full
    format and a right answer on its example); the puzzle's own turn and prefix unchanged. The
    examples are none of the paper's puzzles."""
    plain, shown = small(chat_template=True).train[0], small(chat_template=True, shots=shots)
    example = shown.train[0]
    roles = [m["role"] for m in example.prompt]  # type: ignore[union-attr]
    assert roles == ["system", *["user", "assistant"] * shots, "user"]
    assert example.prompt[0] == plain.prompt[0] and example.prompt[-1] == plain.prompt[-1]  # type: ignore[index]
    assert example.assistant_prefix == plain.assistant_prefix
    for (numbers, target, reply), turn in zip(SHOTS, example.prompt[2::2], strict=False):  # type: ignore[index]
        assert turn["content"] == ASSISTANT_PREFIX + reply
        scores = countdown_reward(reply, list(numbers), str(target))
        assert scores["accuracy"] == 1.0 and scores["format_reward"] == 1.0
    if PAPER_FILE.is_file():
        paper = {tuple(sorted(r["numbers"])) for r in json.loads(PAPER_FILE.read_text())}
        assert not paper & {tuple(sorted(n)) for n, _, _ in SHOTS}


def test_shots_by_count_of_numbers() -> None:
    """``shots={3: 2, 4: 3}``: a 3-number puzzle gets the two 3-number examples, a 4-number one
    the 4-number example too (issue 36: the third example cost a 3-number adapter its skill);
    a count with no entry is refused, naming the key and the puzzle."""
    task = small(chat_template=True, shots={3: 2, 4: 3})
    turns: dict[int, set[int]] = {}
    for example in task.train + task.eval:
        turns.setdefault(len(example.reference["numbers"]), set()).add(len(example.prompt))
    assert turns == {3: {1 + 2 * 2 + 1}, 4: {1 + 2 * 3 + 1}}
    with pytest.raises(ConfigError) as e:
        small(chat_template=True, shots={3: 2})
    assert e.value.key == "shots" and "4-number puzzles" in str(e.value)


def test_shots_check_every_try_right() -> None:
    """Each worked example's tries compute right, and a try says ``yes`` exactly when it reaches
    the target: the examples teach a check, not a fixed number of tries."""
    step = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)")
    ops = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
    for numbers, target, reply in SHOTS:
        tries = re.findall(r"Try ([^:]*): (yes|not \d+)", reply)
        assert len(tries) >= 2 and tries[-1][1] == "yes"
        for chain, verdict in tries:
            steps = [step.fullmatch(s).groups() for s in chain.split(", then ")]  # type: ignore[union-attr]
            assert len(steps) == len(numbers) - 1  # every number, one step each after the first
            for (a, op, b, result), previous in zip(steps, [None, *steps], strict=False):
                assert ops[op](int(a), int(b)) == int(result)
                assert previous is None or previous[3] == a  # a chain: each step goes on
            assert (verdict == "yes") == (int(steps[-1][3]) == target)


def test_score_keys_and_values() -> None:
    task = small()
    ex = task.train[0]
    solution = generate_puzzles(12, 0)[0]["solution"]
    completions = [
        f" reasoning </think>\n<answer>{solution}</answer>",  # right answer, full format
        " nothing useful",
        " x</think> <answer>1 + 1</answer>",  # think + answer blocks, wrong answer
    ]
    scores = task.score([ex] * 3, completions)
    public = {k for k in scores if not k.startswith("_")}
    assert public == {"reward", "format_reward", "answer_reward", "accuracy", "closeness"}
    private = {"_template_answer", "_form", "_blind", "_answered"}  # for summarize alone
    assert set(scores) - public == private
    assert scores["_answered"] == [1.0, 0.0, 1.0]  # an answer pair, right or wrong
    assert scores["reward"] == [1.1, 0.0, 0.06]
    assert scores["accuracy"] == [1.0, 0.0, 0.0]
    assert scores["format_reward"] == [1.0, 0.0, 0.6]
    assert scores["closeness"][:2] == [1.0, 0.0]  # the solution; no answer


@pytest.mark.parametrize("blind_baseline", [False, True])
def test_a_repeated_completion_scores_as_it_does_alone(blind_baseline: bool) -> None:
    """Scoring remembers each (format, answer, puzzle) within a call: rows that repeat one (as
    members near one mean do, also when their reasoning differs) get exactly the scores each
    gets scored by itself; the same answer in another format, or on another puzzle, is scored
    for that."""
    task = small(blind_baseline=blind_baseline, closeness_weight=0.5, format_weight=0.02)
    a, b = task.train[0], task.train[1]
    solution = generate_puzzles(12, 0)[0]["solution"]
    right = f" r </think>\n<answer>{solution}</answer>"
    other = " x</think> <answer>1 + 1</answer>"
    reworded = f" other steps </think>\n<answer> {solution} </answer>"  # same answer and format
    unformatted = f" no think <answer>{solution}</answer>"  # same answer, format 0.5
    rows = [(a, right), (a, other), (a, right), (b, right), (a, right), (a, reworded)]
    rows += [(a, unformatted)]
    together = task.score([e for e, _ in rows], [c for _, c in rows])
    examples = [e for e, _ in rows]  # the blind rates are over the call's puzzles: keep them
    for i, (_, completion) in enumerate(rows):
        texts = [completion if j == i else f" filler {j}" for j in range(len(rows))]
        alone = task.score(examples, texts)
        assert {k: v[i] for k, v in together.items()} == {k: v[i] for k, v in alone.items()}
    assert together["accuracy"][:4] == [1.0, 0.0, 1.0, 0.0]  # b's puzzle is not a's
    assert together["format_reward"][5:] == [1.0, 0.5] and together["accuracy"][5:] == [1.0, 1.0]


@pytest.mark.skipif(not PAPER_FILE.is_file(), reason="the paper's countdown.json is not here")
def test_paper_data_file() -> None:
    task = Countdown(data_file=str(PAPER_FILE), eval_samples=None)
    assert len(task.train) == 200 and len(task.eval_examples()) == 2000
    first = json.loads(PAPER_FILE.read_text())[0]
    assert task.train[0].prompt == first["context"]
    assert task.train[0].reference == {"numbers": first["numbers"], "target": first["target"]}
    assert len(Countdown(data_file=str(PAPER_FILE)).eval_examples()) == 32


def overlapping_data(path: Path) -> Path:
    """6 training puzzles, then 4 test puzzles of which 3 repeat training ones (one with its
    numbers in another order)."""
    train = [{"numbers": [n, n + 1, n + 2], "target": str(3 * n + 3)} for n in range(1, 7)]
    test = [
        train[0],
        train[4],
        {"numbers": [8, 6, 7], "target": "21"},  # train[5], numbers reordered
        {"numbers": [50, 60, 70], "target": "180"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in [*train, *test]))
    return path


def test_test_split_repeating_training_puzzles_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: a test split that repeats training puzzles was reported as held-out silently."""
    data = overlapping_data(tmp_path / "cd.jsonl")
    task = Countdown(data_file=str(data), train_size=6, samples_per_generation=2)
    assert task.data_stats() == {"train_test_overlap": 3.0}
    assert (
        f"{data}: 3 of the 4 eval puzzles are also training puzzles (same numbers and target): "
        "eval/* is not a held-out score"
    ) in caplog.text
    caplog.clear()
    assert small().data_stats() == {"train_test_overlap": 0.0} and "eval puzzles" not in caplog.text


def test_missing_data_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        Countdown(data_file=str(tmp_path / "nope.json"))
    assert e.value.key == "data_file" and "does not exist" in str(e.value)


@pytest.mark.parametrize(
    ("kwargs", "bad_key"),
    [
        ({"train_size": 12}, "train_size"),  # leaves no test split
        ({"train_size": 0}, "train_size"),
        ({"samples_per_generation": 0}, "samples_per_generation"),
        ({"samples_per_generation": 6}, "samples_per_generation"),
        ({"eval_samples": 0}, "eval_samples"),
        ({"generate_count": 0}, "generate_count"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"shots": 4, "chat_template": True}, "shots"),  # three worked examples exist
        ({"shots": 1}, "shots"),  # without the chat prompt
        ({"shots": -1, "chat_template": True}, "shots"),
        ({"shots": {"three": 2}, "chat_template": True}, "shots"),
        ({"shots": {3: 2, 4: 5}, "chat_template": True}, "shots"),
    ],
)
def test_bad_config(kwargs: dict, bad_key: str) -> None:
    with pytest.raises(ConfigError) as e:
        small(**kwargs)
    assert e.value.key == bad_key


def test_yaml_composes_and_instantiates() -> None:
    import evolm.config  # noqa: F401  (registers the schemas)

    assert OmegaConf.load(CONF_DIR / "task" / "countdown.yaml").defaults == [
        "schema_countdown",
        "_self_",
    ]
    with initialize_config_dir(config_dir=str(CONF_DIR)):
        cfg = compose("config", overrides=["task=countdown", "task.eval_samples=null"])
    task = instantiate(cfg.task, _execution_whitelist_=["evolm.*"])
    assert isinstance(task, Countdown) and len(task.train) == 200
    assert len(task.eval_examples()) == 200 and task.sampling.max_new_tokens == 1024


def test_chain_solver_finds_in_order_chains_first() -> None:
    from evolm.task.countdown.data import chain_expression, solve_chain
    from evolm.task.countdown.reward import countdown_reward

    assert solve_chain([79, 85, 34], "198") == ([79, 85, 34], "++")
    assert chain_expression([3, 5, 2], "+*") == "(3 + 5) * 2"
    assert chain_expression([3, 5, 2, 4], "*+/") == "(3 * 5 + 2) / 4"
    assert chain_expression([9, 5, 2], "--") == "9 - 5 - 2"
    assert solve_chain([2, 3, 4], "14") == ([3, 4, 2], "+*")  # no chain in the given order
    assert solve_chain([1, 2], "7") is None
    assert solve_chain([5, 3], "-2", any_order=False) is None
    assert solve_chain([5, 3], "-2") == ([3, 5], "-")
    for record in generate_puzzles(100, 3):  # every chain found is a correct answer
        found = solve_chain(record["numbers"], record["target"])
        if found is not None:
            answer = f"x </think>\n<answer> {chain_expression(*found)} </answer>"
            assert countdown_reward(answer, record["numbers"], record["target"])["accuracy"] == 1
