"""``task=countdown``: reach a target number with the given numbers (the paper's main task).

Reward per completion (see :mod:`evolm.task.countdown.reward`): ``0.1 * format + answer``,
scored on the completion only; ``accuracy`` is 1 when the answer is correct. Puzzles come from
one of evolm's generators (:mod:`evolm.task.countdown.sources`: ``tree``, ``uniform``) or from a
JSON file with the fields of the paper's ``countdown.json``; the first ``train_size`` records are
the training split and the rest the test split. Every evaluation also reports how much of its
accuracy an answer template explains (:meth:`Countdown.summarize`,
:mod:`evolm.task.countdown.shortcuts`).
"""

from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from evolm import metrics as M
from evolm.errors import ConfigError
from evolm.task.base import Example, Sampling, Scores, Task, cycling_window
from evolm.task.countdown.blind import BlindRates
from evolm.task.countdown.data import load_countdown_json
from evolm.task.countdown.reward import (
    closeness_of_value,
    extract_answer,
    format_reward,
    paper_prompt,
    paper_scores,
    parse_target,
    reward_of_value,
    value_of_answer,
)
from evolm.task.countdown.shortcuts import (
    FAMILIES,
    AnswerShape,
    PuzzleInfo,
    answer_shape,
    classify,
    form_code,
)
from evolm.task.countdown.shots import SHOTS
from evolm.task.countdown.sources import (
    check_source,
    drop_split,
    generated_splits,
    puzzle_stream,
)
from evolm.task.countdown.summary import shortcut_summary

log = logging.getLogger(__name__)


SYSTEM_PROMPT = (
    "You are a helpful assistant. You first think about the reasoning process in your mind and "
    "then provide the user with the answer."
)
"""The paper prompt's first sentence: the system message of the chat variant."""

ASSISTANT_PREFIX = "Let me solve this step by step.\n<think>"
"""The paper prompt's ending: appended after the assistant header in the chat variant."""

SCORE_KEYS = ("reward", "format_reward", "answer_reward", "accuracy", "closeness")
PAPER_WEIGHTS = (0.1, 0.0)
"""``(format_weight, closeness_weight)`` of the paper's reward: ``0.1 * format + answer``."""
TEMPLATE_ANSWER, FORM, BLIND, ANSWERED = "_template_answer", "_form", "_blind", "_answered"
"""Per-row data for :meth:`Countdown.summarize` alone (``_`` keys are never logged): whether the
answer is a template answer (1/0), its form's code (NaN: no answer that parses), its form's
blind rate on the puzzles scored with it (:mod:`evolm.task.countdown.blind`), and whether the
completion gives an answer at all (1/0: a closed ``<answer>`` pair, parsed or not)."""
Placed = tuple[int, dict[str, Any]]
"""A record and its place: its position in the data file, or in the generator's stream."""
_SHAPES_KEPT = 65_536  # answer shapes remembered (members often write the same answer)


def chat_messages(prompt: str) -> tuple[list[dict[str, str]], str]:
    """Split the paper's verbatim prompt into (system + user messages, assistant prefix)."""
    if not (prompt.startswith(SYSTEM_PROMPT) and prompt.endswith(ASSISTANT_PREFIX)):
        raise ValueError("not a paper prompt: it must start with the system sentence")
    user = prompt[len(SYSTEM_PROMPT) : -len(ASSISTANT_PREFIX)]
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
    return messages, ASSISTANT_PREFIX


def _shots_by_count(
    shots: int | Mapping[Any, int], chat: bool
) -> dict[int | None, list[dict[str, str]]]:
    """``task.shots``'s turns by the puzzles' count of numbers (``None``: every count)."""
    if not isinstance(shots, Mapping):
        return {None: _shot_turns(shots, chat)}
    by_count: dict[int | None, list[dict[str, str]]] = {}
    for count, n in shots.items():
        if not (isinstance(count, int) or str(count).isdigit()):
            raise ConfigError(
                "shots", f"keys are counts of numbers, got {count!r}", "e.g. shots={3:2,4:3}"
            )
        by_count[int(count)] = _shot_turns(n, chat)
    return by_count


def _shot_turns(shots: int, chat: bool) -> list[dict[str, str]]:
    """The user/assistant turns of the first ``shots`` worked examples (``task.shots``)."""
    if not (isinstance(shots, int) and 0 <= shots <= len(SHOTS)):
        raise ConfigError("shots", f"must be in [0, {len(SHOTS)}], got {shots}", "e.g. shots=2")
    if shots and not chat:
        raise ConfigError(
            "shots", "needs the chat prompt (the examples are earlier turns)", "chat_template=true"
        )
    turns: list[dict[str, str]] = []
    for numbers, target, reply in SHOTS[:shots]:
        messages, prefix = chat_messages(paper_prompt(numbers, target))
        turns += [messages[1], {"role": "assistant", "content": prefix + reply}]
    return turns


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


def _check_train_size(n: int, train_size: int) -> None:
    if not 1 <= train_size < n:
        raise ConfigError(
            "train_size",
            f"must be in [1, {n - 1}] for {n} records (the rest is the test split), "
            f"got {train_size}",
            "lower train_size, or raise generate_count / use a larger data_file",
        )


def _check_counts(per_generation: int | None, eval_samples: int | None) -> None:
    if per_generation is not None:
        _positive("samples_per_generation", per_generation, "e.g. 8, or null for every one")
    if eval_samples is not None:
        _positive("eval_samples", eval_samples, "e.g. 32, or null for the whole test split")


def _check_window(per_generation: int, train: int) -> None:
    if per_generation > train:
        raise ConfigError(
            "samples_per_generation",
            f"{per_generation} exceeds the training split ({train} records)",
            "use at most train_size prompts per generation",
        )


def _keep_counts(
    train: list[Placed], counts: int | Sequence[int] | None, data: str | None
) -> list[Placed]:
    """The training records with ``len(numbers)`` in ``counts`` (``train_n``: a count or a
    list of them; None: all)."""
    if counts is None:
        return train
    wanted = {counts} if isinstance(counts, int) else {int(n) for n in counts}
    kept = [(i, r) for i, r in train if len(r["numbers"]) in wanted]
    if not kept:
        found = sorted({len(r["numbers"]) for _, r in train})
        raise ConfigError(
            "train_n",
            f"no training puzzle of {data or 'the generated ones'} has {sorted(wanted)} numbers "
            f"(they have {found})",
            f"e.g. train_n=[{found[0] if found else 3}], or null for all",
        )
    log.info("train_n=%s: %d of the %d training puzzles", sorted(wanted), len(kept), len(train))
    return kept


def _keep_families(
    train: list[Placed], families: str | Sequence[str] | None, data: str | None
) -> list[Placed]:
    """The training records whose family (:func:`~evolm.task.countdown.shortcuts.classify`)
    is in ``families`` (``train_family``: a family or a list of them; None: all)."""
    if families is None:
        return train
    wanted = {families} if isinstance(families, str) else set(families)
    if unknown := sorted(wanted - set(FAMILIES)):
        raise ConfigError(
            "train_family", f"unknown {unknown}", f"use some of {list(FAMILIES)}, or null"
        )
    have = [(classify(r["numbers"], r["target"]).family, (i, r)) for i, r in train]
    kept = [placed for family, placed in have if family in wanted]
    if not kept:
        found = sorted({str(family) for family, _ in have})
        raise ConfigError(
            "train_family",
            f"no training puzzle of {data or 'the generated ones'} is {sorted(wanted)} "
            f"(they are {found})",
            "name a family they have, or null for all",
        )
    log.info(
        "train_family=%s: %d of the %d training puzzles", sorted(wanted), len(kept), len(train)
    )
    return kept


def _cap_rules(train: list[Placed], share: float | None, data: str | None) -> list[Placed]:
    """The training records thinned until no fixed rule (``PuzzleInfo.rules``: a pattern in the
    puzzle's order, by size or with the first number negated) solves more than ``share`` of the
    puzzles of one size (``train_max_rule_share``; None: all kept). Greedy and deterministic:
    the most-paid rule of any size (its share, then its name, decide) loses its last puzzle in
    split order, until none is over."""
    if share is None:
        return train
    if not 0 < share <= 1:
        raise ConfigError(
            "train_max_rule_share", f"must be in (0, 1], got {share}", "e.g. 0.1, or null"
        )
    infos = [classify(r["numbers"], r["target"]) for _, r in train]
    sizes = Counter(info.size for info in infos)  # puzzles kept, per size
    counts = Counter((info.size, rule) for info in infos for rule in info.rules)
    solved_by: defaultdict[tuple[int, str], list[int]] = defaultdict(list)  # in split order
    for k, info in enumerate(infos):
        for rule in info.rules:
            solved_by[info.size, rule].append(k)
    dropped: set[int] = set()
    while over := [(n / sizes[size], rule, size) for (size, rule), n in counts.items()
                   if n > share * sizes[size]]:  # fmt: skip
        _, rule, size = max(over)
        last = solved_by[size, rule]
        while last[-1] in dropped:
            last.pop()
        k = last.pop()
        dropped.add(k)
        sizes[size] -= 1
        counts.subtract((size, r) for r in infos[k].rules)
    kept = [k for k in range(len(train)) if k not in dropped]
    if not kept:
        raise ConfigError(
            "train_max_rule_share",
            f"no training puzzle of {data or 'the generated ones'} is left with no fixed rule "
            f"over {share:.0%} of its size",
            "raise it (the paper's 200 keep 152 at 0.1), or null",
        )
    log.info(
        "train_max_rule_share=%s: %d of the %d training puzzles (sizes %s)",
        share,
        len(kept),
        len(train),
        dict(sorted((+sizes).items())),
    )
    return [train[k] for k in kept]


class Countdown(Task):
    """The Countdown task.

    Args:
        data_file: a Countdown JSON array (the paper's ``countdown.json``) or JSON-lines file
            with ``numbers`` and ``target``; ``None`` generates ``generate_count`` puzzles.
        train_size: the first ``train_size`` records are the training split, the rest the test
            split (the paper: 200 of 2,200).
        generate_count: how many puzzles to generate when ``data_file`` is ``None``.
        seed: the generator's seed (same seed, same puzzles).
        generator: ``tree`` (evolm's random expression trees; about 18% are sums) or
            ``uniform`` (3-4 numbers of 1..99, a target uniform in ``[target_min,
            target_max]``, kept if solvable: the TinyZero style); see
            :mod:`evolm.task.countdown.sources`.
        target_min, target_max: the uniform generator's target range.
        drop_templates: ``None``, ``train``, ``test`` or ``both``: leave out of that split every
            puzzle a fixed operator pattern solves (generated splits keep their size, a data
            file's split shrinks).
        drop_size_rules: with ``drop_templates``, also leave out the puzzles any other fixed
            rule solves: a size-order rule (a fixed pattern over the numbers sorted largest
            first, as ``eval/shortcut/by_size``) or a first-negated one (``-a + b + c``, as
            ``eval/shortcut/first_negated``): no fixed rule at all solves what is left.
        train_n: ``None``, or the counts of numbers the training puzzles keep, e.g. ``[3]``:
            train on the 3-number puzzles alone (``accuracy/n3``'s kind), a curriculum's first
            stage (the next: a run from its adapter, ``lora.init_from=<run>/adapter``, with
            ``train_n=null``). The test split is unchanged.
        train_family: ``None``, or the puzzle families
            (:data:`~evolm.task.countdown.shortcuts.FAMILIES`) the training puzzles keep,
            e.g. ``["muldiv"]``: train on the puzzles that only ``*`` or ``/`` solve, whose
            searches a run on all puzzles stops trying (docs/results/countdown-paper-split,
            session 29). Applied after ``train_n`` and ``train_max_rule_share``; the test split
            is unchanged.
        train_max_rule_share: ``None``, or a share in (0, 1]: the training puzzles (after
            ``train_n``, before ``train_family``) are thinned until no fixed rule solves more
            than that share of the puzzles of one size (``eval/shortcut_accuracy``'s rules), so
            ES cannot pay a rule more than that: issue 36's 0.5B learned ``-a + b + c`` from
            the 40 ``addsub`` training puzzles, 55% of them that rule's. The paper's 200 keep
            152 at 0.1 (52 of 3 numbers). ``train_family`` then only drops puzzles: with
            ``["template", "addsub"]`` the 76 that need ``*`` or ``/``, of which issue 36's 0.5B
            (z5s2) solved none of the 48 probed on the CPU (sessions 37 and 38): a generation has
            half the rows and, with the answer-only reward (``format_weight=0``, no closeness,
            no blind baseline), the same ranking of its members (a puzzle every member misses
            adds the same 0 to each; a ``+``/``-`` rule still pays the same puzzles). The test
            split is unchanged.
        samples_per_generation: training prompts per generation; generation ``g`` takes the
            ``g``-th window of the training split, wrapping around (:func:`cycling_window`);
            ``None``: every training prompt every generation (the paper's setting, also after
            ``drop_templates`` shrank the split).
        eval_samples: evaluate the mean on the first ``eval_samples`` test records; ``None``
            means the whole test split (larger values are clamped to it).
        chat_template: ``False``: the paper's verbatim prompt; ``True``: a system message (the
            prompt's first sentence), a user message (the rest) and the assistant prefix
            ``"Let me solve this step by step.\\n<think>"``.
        shots: worked examples (:data:`~evolm.task.countdown.shots.SHOTS`, at most 3) shown
            before each puzzle as earlier user/assistant turns, with ``chat_template``: the
            paper's prompt otherwise unchanged, its puzzles unchanged; 0 (the paper): none.
            A mapping from a puzzle's count of numbers to its examples, e.g. ``{3: 2, 4: 3}``:
            the 4-number example for 4-number puzzles alone (every count in the data needs
            an entry).
        max_new_tokens, temperature, top_p: decoding (the paper: 1024 tokens, greedy).
        eval_temperature: the temperature of the mean's evaluations (``eval_sampling``);
            ``None``: ``temperature``. E.g. members that sample (``temperature=0.7``), a mean
            evaluated greedily (``eval_temperature=0``).
        stop: stop strings (:attr:`~evolm.sampling.Sampling.stop`), e.g. ``["</answer>"]``: a
            completion ends with its first answer block. The paper's reward reads the LAST
            answer block, so this changes what is scored only for completions that write a
            second one (the paper's runs, with no stop string, scored the last).
        blind_baseline: ``True``: every completion's ``reward`` is the paper's minus its
            answer form's blind rate on the puzzles scored with it
            (:mod:`evolm.task.countdown.blind`): a form written whatever the target earns 0 on
            average, so ES fitness pays only for choosing the answer by the puzzle (issue 36's
            runs climbed to 14% by writing a few such forms). A completion with no answer,
            or in a form that solves none of the puzzles, scores 0 and every wrong answer
            less: members that answer right less often than their forms would blindly are
            paid most for not answering (docs/tasks.md). ``answer_reward`` and ``accuracy``
            keep their meaning; ``False`` (default): the paper's reward.
        format_weight: the weight of the format reward in ``reward`` (the paper: 0.1).
        closeness_weight: the weight of ``closeness`` in ``reward``
            (:func:`~evolm.task.countdown.reward.closeness`: 1 at the target, 0 at 100%
            relative error or for an answer that does not use each number once); 0 (the
            paper): not in the reward. With ``blind_baseline``, the subtracted baseline is the
            form's blind mean of ``correct + closeness_weight * closeness``.
    """

    def __init__(
        self,
        data_file: str | None = None,
        train_size: int = 200,
        generate_count: int = 400,
        seed: int = 0,
        generator: str = "tree",
        target_min: int = 1,
        target_max: int = 100,
        drop_templates: str | None = None,
        drop_size_rules: bool = False,
        train_n: int | Sequence[int] | None = None,
        train_family: str | Sequence[str] | None = None,
        train_max_rule_share: float | None = None,
        samples_per_generation: int | None = 16,
        eval_samples: int | None = 32,
        chat_template: bool = False,
        shots: int | Mapping[int, int] = 0,
        max_new_tokens: int = 1024,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] = (),
        blind_baseline: bool = False,
        format_weight: float = 0.1,
        closeness_weight: float = 0.0,
        eval_temperature: float | None = None,
    ) -> None:
        for key, weight in (
            ("format_weight", format_weight),
            ("closeness_weight", closeness_weight),
        ):
            if not (math.isfinite(weight) and weight >= 0):
                raise ConfigError(f"task.{key}", f"must be a number >= 0, got {weight}", "e.g. 0.1")
        self.blind_baseline = blind_baseline
        self.weights = (format_weight, closeness_weight)
        stop = stop if isinstance(stop, str) else tuple(stop)  # a bare string: Sampling refuses
        self.sampling = Sampling(max_new_tokens, temperature, top_p, stop=stop)  # type: ignore[arg-type]
        if eval_temperature is not None and not eval_temperature >= 0:
            raise ConfigError(
                "task.eval_temperature", f"must be >= 0, got {eval_temperature}", "0 for greedy"
            )
        self.eval_sampling = (
            self.sampling
            if eval_temperature is None
            else replace(self.sampling, temperature=eval_temperature)
        )
        self.chat_template = chat_template
        self._shots = _shots_by_count(shots, chat_template)
        check_source(generator, drop_templates, target_min, target_max)
        if drop_size_rules and drop_templates is None:
            raise ConfigError(
                "drop_size_rules",
                "drops from the split drop_templates names, and it is null",
                "e.g. drop_templates=train",
            )
        _check_counts(samples_per_generation, eval_samples)
        targets = (target_min, target_max)
        train, test = self._splits(
            data_file,
            train_size,
            generate_count,
            seed,
            generator,
            targets,
            drop_templates,
            drop_size_rules,
        )
        train = _keep_counts(train, train_n, data_file)
        train = _cap_rules(train, train_max_rule_share, data_file)
        train = _keep_families(train, train_family, data_file)
        self.samples_per_generation = samples_per_generation or len(train)
        _check_window(self.samples_per_generation, len(train))
        kind = "" if generator == "tree" else f"{generator}, "
        where = f"{data_file} record" if data_file else f"generated ({kind}seed {seed}) puzzle"
        self.train = [self._example(r, f"{where} {i}") for i, r in train]
        if eval_samples is not None and eval_samples > len(test):
            log.warning("eval_samples=%d > %d test records: using all", eval_samples, len(test))
        self.eval = [self._example(r, f"{where} {i}") for i, r in test[:eval_samples]]
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
        self._puzzles: dict[tuple[tuple[int, ...], str], PuzzleInfo] = {}
        self._shapes: dict[tuple[str, tuple[int, ...]], AnswerShape | None] = {}

    @staticmethod
    def _splits(
        data_file: str | None,
        train_size: int,
        generate_count: int,
        seed: int,
        generator: str,
        targets: tuple[int, int],
        drop: str | None,
        size_rules: bool,
    ) -> tuple[list[Placed], list[Placed]]:
        """The training and test records with their places (in the file, or the generator's
        stream): a data file's (filtered by ``drop``, ``size_rules``), or generated."""
        if data_file is not None:
            records = list(enumerate(load_countdown_json(data_file, key="data_file")))
            _check_train_size(len(records), train_size)
            train, test = records[:train_size], records[train_size:]
            if drop in ("train", "both"):
                train = drop_split(train, "training", data_file, size_rules)
            if drop in ("test", "both"):
                test = drop_split(test, "test", data_file, size_rules)
            return train, test
        _positive("generate_count", generate_count, "generate more puzzles than train_size")
        _check_train_size(generate_count, train_size)
        stream = puzzle_stream(generator, seed, *targets)
        train, test = generated_splits(stream, generate_count, train_size, drop, size_rules)
        return [(r["id"], r) for r in train], [(r["id"], r) for r in test]

    def _example(self, record: dict[str, Any], source: str) -> Example:
        text = paper_prompt(record["numbers"], record["target"])
        reference = {"numbers": list(record["numbers"]), "target": record["target"]}
        if not self.chat_template:
            return Example(prompt=text, reference=reference, source=source)
        messages, prefix = chat_messages(text)
        count = len(record["numbers"])
        turns = self._shots.get(None, self._shots.get(count))
        if turns is None:
            have = sorted(k for k in self._shots if k is not None)
            raise ConfigError(
                "shots",
                f"has no entry for {count}-number puzzles ({source}); it has {have}",
                f"add one, e.g. shots={{{count}:2,...}}",
            )
        messages[1:1] = turns
        return Example(prompt=messages, reference=reference, assistant_prefix=prefix, source=source)

    def train_examples(self, generation: int) -> list[Example]:
        return cycling_window(self.train, generation, self.samples_per_generation)

    def data_stats(self) -> dict[str, float]:
        return {"train_test_overlap": float(self.overlap)}

    def eval_examples(self) -> list[Example]:
        return self.eval

    def score(self, examples: Sequence[Example], completions: Sequence[str]) -> Scores:
        scores: Scores = {k: [] for k in (*SCORE_KEYS, TEMPLATE_ANSWER, FORM, BLIND, ANSWERED)}
        refs = [e.reference for e in examples]
        blind = BlindRates(
            [(r["numbers"], parse_target(r["target"])) for r in refs], self.weights[1]
        )
        # a row's scores are those of its format reward and its answer's text: members that
        # reason differently to one answer (most rows of a generation) are scored once
        memo: dict[tuple[float, str | None, tuple[int, ...], str], dict[str, float]] = {}
        for ref, completion in zip(refs, completions, strict=True):
            fmt, answer = format_reward(completion), extract_answer(completion)
            key = fmt, answer, tuple(ref["numbers"]), str(ref["target"])
            row = memo.get(key)
            if row is None:
                row = memo[key] = self._score_row(fmt, answer, ref, blind)
            for name, value in row.items():
                scores[name].append(value)
        return scores

    def _score_row(
        self, fmt: float, answer: str | None, ref: Mapping[str, Any], blind: BlindRates
    ) -> dict[str, float]:
        """The scores, template flag, form code and blind rate of a completion with format
        reward ``fmt`` and last answer ``answer``."""
        format_weight, closeness_weight = self.weights
        value = value_of_answer(answer, ref["numbers"])
        row = paper_scores(fmt, reward_of_value(value, ref["target"]))
        row["closeness"] = closeness_of_value(value, ref["target"])
        if self.weights != PAPER_WEIGHTS:  # the paper's is rounded to REWARD_VALUES
            row["reward"] = (
                format_weight * row["format_reward"]
                + row["answer_reward"]
                + closeness_weight * row["closeness"]
            )
        shape = self._shape(answer, ref["numbers"])
        tokens = None if shape is None else shape.tokens
        if self.blind_baseline:
            row["reward"] -= blind.baseline(tokens, ref["numbers"])
        row[TEMPLATE_ANSWER] = float(shape is not None and shape.template)
        row[FORM] = math.nan if shape is None else form_code(shape.form)
        row[BLIND] = blind.of_answer(tokens, ref["numbers"])
        row[ANSWERED] = float(answer is not None)
        return row

    def summarize(self, examples: Sequence[Example], scores: Scores) -> dict[str, float]:
        """How much of this evaluation's accuracy a shortcut explains (names:
        :mod:`evolm.metrics`; :func:`~evolm.task.countdown.summary.shortcut_summary`). Each
        puzzle is classified once per task."""
        infos = [self.puzzle_info(e) for e in examples]
        correct = scores[M.CORRECT_SCORE]
        return shortcut_summary(
            infos,
            correct,
            scores[TEMPLATE_ANSWER],
            scores[FORM],
            scores.get(BLIND, []),
            scores.get(ANSWERED, []),
        )

    def puzzle_info(self, example: Example) -> PuzzleInfo:
        """The example's puzzle classified (:func:`~evolm.task.countdown.shortcuts.classify`),
        remembered by numbers (in their order) and target."""
        ref = example.reference
        key = tuple(ref["numbers"]), str(ref["target"])
        info = self._puzzles.get(key)
        if info is None:
            info = self._puzzles[key] = classify(ref["numbers"], ref["target"])
        return info

    def _shape(self, answer: str | None, numbers: Sequence[int]) -> AnswerShape | None:
        """The shape of an answer, remembered by its text: ~0.04 ms for each new one."""
        if answer is None:
            return None
        key = answer, tuple(numbers)
        if key not in self._shapes:
            if len(self._shapes) >= _SHAPES_KEPT:
                self._shapes.clear()
            self._shapes[key] = answer_shape(answer, numbers)
        return self._shapes[key]
