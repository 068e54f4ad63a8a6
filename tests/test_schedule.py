"""Rows scheduled by expected work (issue 29): :func:`evolm.dist.balanced` shards, the
longest-expected-first order one process hands its engine, and the per-prompt history
(:class:`evolm.worklog.WorkLog`) the loop keeps and checkpoints. Greedy completions never change."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from evolm import dist
from evolm.callbacks import RunContext
from evolm.checkpoint import latest_checkpoint, save_checkpoint
from evolm.dist import balanced
from evolm.engine.base import Engine, Row
from evolm.engine.local import LocalEngine
from evolm.es import ES, ESState
from evolm.evaluate import PREFILL_COST, evaluate, render, row_costs
from evolm.loop import ESLoop
from evolm.lora import LoraLayout, LoraPopulation, LoraSpec, es_scales, uniform_scales
from evolm.sampling import Sampling
from evolm.task.base import Example
from evolm.task.conciseness import Conciseness
from evolm.worklog import WorkLog

# -- balanced ------------------------------------------------------------------------------


def test_balanced_splits_by_expected_work_longest_first() -> None:
    """LPT: 5 4 3 2 1 over 2 ranks -> {5, 2, 1} and {4, 3} (8 vs 7; interleaved: 12 vs 3)."""
    assert balanced([5.0, 1.0, 4.0, 2.0, 3.0], 2) == [[0, 3, 1], [2, 4]]
    assert balanced([2.0, 2.0, 2.0], 2) == [[0, 2], [1]]  # ties: by index, lowest rank
    assert balanced([3.0, 1.0, 3.0], 1) == [[0, 2, 1]]  # one rank: a stable longest-first sort
    assert balanced([], 3) == [[], [], []]
    rng = random.Random(0)
    for ranks in (1, 2, 3, 8):
        costs = [rng.choice([16.0, 1024.0, rng.uniform(16, 1024)]) for _ in range(301)]
        parts = balanced(costs, ranks)
        assert parts == balanced(list(costs), ranks)  # deterministic
        assert sorted(i for part in parts for i in part) == list(range(len(costs)))
        for part in parts:  # admission order: longest expected first, ties by index
            keys = [(-costs[i], i) for i in part]
            assert keys == sorted(keys)
        loads = [sum(costs[i] for i in part) for part in parts]
        assert max(loads) - min(loads) <= max(costs)


def test_balanced_refuses_what_it_cannot_split() -> None:
    with pytest.raises(ValueError, match="ranks must be >= 1"):
        balanced([1.0], 0)
    with pytest.raises(ValueError, match="finite and >= 0"):
        balanced([1.0, float("nan")], 2)


def test_shard_and_unshard_follow_an_assignment() -> None:
    class Three(dist.Comm):
        world_size = 3

    items = [f"row{i}" for i in range(7)]
    assignment = balanced([7.0, 1.0, 5.0, 2.0, 6.0, 0.0, 3.0], 3)
    parts = []
    for r in range(3):
        comm = Three()
        comm.rank = r
        parts.append(comm.shard(items, assignment))
    assert parts == [[items[i] for i in share] for share in assignment]
    assert Three().unshard(parts, assignment) == items
    assert Three().unshard([items[0::3], items[1::3], items[2::3]]) == items  # the default
    with pytest.raises(ValueError, match="2 shares for 3 ranks"):
        Three().shard(items, assignment[:2])


# -- evaluate, one process, a real tiny model ------------------------------------------------

PROMPTS = ["Solve: 3 + 5 =", "Is the sky blue?", "Name three colours of the rainbow.", "Why?"]


class Recording(Engine):
    """A real engine, recording what reaches it."""

    def __init__(self, inner: LocalEngine) -> None:
        self.inner, self.layout = inner, inner.layout
        self.calls: list[tuple[str, list[Row]]] = []

    def format_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        return self.inner.format_chat(messages)

    @property
    def batches_any_rows(self) -> bool:
        return self.inner.batches_any_rows

    def generate(
        self, prompts: Sequence[str], adapters: LoraPopulation | None, sampling: Sampling, seed: int
    ) -> list[list[str]]:
        self.calls.append(("generate", []))
        return self.inner.generate(prompts, adapters, sampling, seed)

    def generate_rows(
        self,
        prompts: Sequence[str],
        adapters: LoraPopulation | None,
        rows: Sequence[Row],
        sampling: Sampling,
        seed: int,
    ) -> list[str]:
        self.calls.append(("rows", list(rows)))
        return self.inner.generate_rows(prompts, adapters, rows, sampling, seed)

    def kl_to_base(
        self, prompts: Sequence[str], completions: Sequence[str], adapter: LoraPopulation
    ) -> list[list[float]]:
        return self.inner.kl_to_base(prompts, completions, adapter)

    def close(self) -> None: ...


@pytest.fixture(scope="module")
def engine(tiny_model_dir: str) -> LocalEngine:
    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), LoraSpec(rank=2))
    return LocalEngine(tiny_model_dir, layout, device="cpu")


def population(layout: LoraLayout, members: int) -> LoraPopulation:
    strategy = ES(population_size=members, sigma=0.5)
    state = strategy.init([torch.zeros(s) for s in layout.shapes()], seed=3)
    return LoraPopulation(layout, tuple(strategy.sample(state, strategy.ask(state))))


def test_expected_lengths_reorder_rows_never_completions(engine: LocalEngine) -> None:
    """Greedy: the rows reach the engine longest-expected first (ties in member-major order)
    and the evaluation is the one without ``expected``: completions, scores, fitness, metrics,
    diagnostics, and every row's length (its tokens)."""
    task = Conciseness(max_new_tokens=10)
    examples = [Example(prompt=p, reference={"answer": "8"}) for p in PROMPTS]
    pop = population(engine.layout, 3)
    plain = evaluate(Recording(engine), task, examples, pop, seed=0)
    recorder = Recording(engine)
    expected = [3.0, 40.0, 12.0, 40.0]
    ev = evaluate(recorder, task, examples, pop, seed=0, expected=expected)
    [(kind, rows)] = recorder.calls
    every = [(m, p) for m in range(3) for p in range(4)]  # member-major: row i = 4 m + p
    assert kind == "rows" and rows == sorted(every, key=lambda r: (-expected[r[1]], r))
    assert rows[:4] == [(0, 1), (0, 3), (1, 1), (1, 3)]
    assert ev.completions == plain.completions
    assert ev.scores == plain.scores and torch.equal(ev.fitness, plain.fitness)
    assert ev.metrics == plain.metrics and ev.diagnostics == plain.diagnostics
    flat = [c for member in plain.completions for c in member]
    assert ev.lengths == plain.lengths == [float(c.tokens) for c in flat]  # type: ignore[attr-defined]
    assert sorted(ev.rows) == sorted(plain.rows) == [(m, p) for m in range(3) for p in range(4)]


class Grouping(Recording):
    """An engine whose ``generate_rows`` groups rows by member set (servers)."""

    @property
    def batches_any_rows(self) -> bool:
        return False


def test_sampled_rows_and_grouping_engines_keep_their_order(engine: LocalEngine) -> None:
    """With sampling, a row's random draws depend on its place; an engine that groups rows by
    member set gains nothing from an order: ``expected`` is not used (one ``generate``)."""
    task = Conciseness(max_new_tokens=6, temperature=1.0)
    examples = [Example(prompt=p, reference={"answer": "8"}) for p in PROMPTS]
    recorder = Recording(engine)
    pop = population(engine.layout, 2)
    ev = evaluate(recorder, task, examples, pop, seed=0, expected=[1.0, 9.0, 5.0, 2.0])
    assert [kind for kind, _ in recorder.calls] == ["generate"]
    assert ev.completions == evaluate(engine, task, examples, pop, seed=0).completions
    grouping = Grouping(engine)
    greedy = Conciseness(max_new_tokens=6)
    evaluate(grouping, greedy, examples, pop, seed=0, expected=[1.0, 9.0, 5.0, 2.0])
    assert [kind for kind, _ in grouping.calls] == ["generate"]
    with pytest.raises(ValueError, match="2 expected lengths for 4 prompts"):
        evaluate(engine, task, examples, pop, seed=0, expected=[1.0, 2.0])


def test_row_costs_add_the_prefill() -> None:
    assert row_costs([10.0, 0.0], 2) == [10.0 + PREFILL_COST, PREFILL_COST] * 2


# -- the history ----------------------------------------------------------------------------


def test_worklog_remembers_each_prompts_last_visit() -> None:
    log = WorkLog(cap=3)
    assert log.expected(["a", "b"]) is None  # nothing known: schedule as without a history
    log.record(["a", "b"], [10.0, 20.0, 30.0, 60.0])  # 2 members, member-major
    assert log.expected(["b", "a", "new"]) == [40.0, 20.0, 30.0]  # new: the mean of the known
    log.record(["a"], [4.0, 6.0])  # the last visit wins
    assert log.expected(["a"]) == [5.0]
    log.record(["c", "d"], [1.0, 2.0])  # cap 3: the least recently visited (b) goes
    assert len(log) == 3 and log.expected(["b"]) is None
    assert log.expected(["b", "a", "c"]) == [3.0, 5.0, 1.0]  # b: the mean of this visit's known
    log.record(["e"], [float("nan")])  # an unknown length is not recorded
    assert len(log) == 3
    with pytest.raises(ValueError, match="3 row lengths for 2 prompts"):
        log.record(["a", "b"], [1.0, 2.0, 3.0])


def test_worklog_survives_a_checkpoint(tmp_path: Path) -> None:
    log = WorkLog()
    prompts = [f"prompt {i}" for i in range(300)]
    log.record(prompts, [float(i % 37) for i in range(600)])
    log.record(prompts[:5], [1.0] * 5)  # revisited: now the newest
    state = ESState(mean=[torch.zeros(2)], seed=0, generation=4)
    save_checkpoint(tmp_path, state, [], {"loop.worklog": log.state_dict()})
    found = latest_checkpoint(tmp_path)  # torch.load(weights_only=True)
    assert found is not None
    restored = WorkLog()
    restored.load_state_dict(found.state["loop.worklog"])
    assert restored.state_dict() == log.state_dict()
    assert restored.expected([*prompts, "unseen"]) == log.expected([*prompts, "unseen"])
    small = WorkLog(cap=10)  # a smaller cap keeps the newest
    small.load_state_dict(log.state_dict())
    assert small.expected(prompts[:5]) == [1.0] * 5 and len(small) == 10


def test_the_loop_schedules_revisited_prompts_by_their_last_lengths(
    tmp_path: Path, engine: LocalEngine
) -> None:
    """Generation 1 has no history (the start's eval saw other prompts): rows as today; from
    generation 2 the training prompts come with their last lengths, longest first; the eval
    of the mean uses the start's eval lengths. The loop's worklog holds every prompt seen."""
    layout = engine.layout
    recorder = Recording(engine)
    spec = LoraSpec(rank=2)
    es = ES(population_size=4, sigma=0.02, alpha=0.6, update="natural")
    scales = uniform_scales(layout)
    state = es.init(layout.init_mean(spec, scales, 0), 0, es_scales(spec, scales))
    task = Conciseness(max_new_tokens=8)
    loop = ESLoop(es, task, recorder, layout, generations=2, eval_every=2, seed=0)
    loop.run(state, RunContext(tmp_path, 2, layout, "tiny"))
    kinds = [kind for kind, _ in recorder.calls]
    # start eval, generation 1 (train prompts never seen), generation 2, final eval
    assert kinds == ["generate", "generate", "rows", "rows"]
    train = [render(engine, e) for e in task.train_examples(2)]
    evals = [render(engine, e) for e in task.eval_examples()]
    assert len(loop.worklog) == len(set(train) | set(evals))
    expected = loop.worklog.expected(train)
    assert expected is not None
    _, rows = recorder.calls[2]
    costs = [expected[p] for _, p in rows]
    assert costs == sorted(costs, reverse=True) and len(rows) == 4 * len(train)
