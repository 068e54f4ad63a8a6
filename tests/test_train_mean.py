"""``train_mean``: the unperturbed ES mean answers each generation's training rows in the members'
engine call, scored apart (``train/mean/*``, ``train/member_gap``), and the health monitor says
when the noise destroys what the mean does. The real tiny model and engine."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig

from evolm import metrics as M
from evolm.callbacks import Callback, GenerationRecord, RunContext
from evolm.callbacks.health import TAG, LearningMonitor
from evolm.callbacks.progress import progress_line
from evolm.diagnostics import member_gap_se
from evolm.engine.local import LocalEngine
from evolm.es import ES, ESState, Population
from evolm.evaluate import evaluate, evaluate_with_extra
from evolm.loop import ESLoop
from evolm.lora import LoraLayout, LoraPopulation, LoraSpec, es_scales, uniform_scales
from evolm.sampling import Sampling
from evolm.task.base import Example, Scores, Task
from evolm.task.conciseness import Conciseness
from tests.helpers import generation_record
from tests.test_dist import LabelEngine, LengthTask, population

TOKENS = 6
GENERATIONS = 3


class Echo(Task):
    """reward = accuracy = 1 when a completion is the base model's own greedy completion of the
    prompt, else 0: the base (and a zero-B mean) scores 1.0, a member the noise changed less."""

    sampling = Sampling(TOKENS)

    def __init__(self, examples: list[Example]) -> None:
        self.examples = examples

    def train_examples(self, generation: int) -> list[Example]:
        return self.examples

    def eval_examples(self) -> list[Example]:
        return self.examples[:2]

    def score(self, examples: Sequence[Example], completions: Sequence[str]) -> Scores:
        pairs = zip(examples, completions, strict=True)
        same = [float(str(c) == e.reference["base"]) for e, c in pairs]
        return {"reward": same, "accuracy": same}


@dataclass(frozen=True)
class SpyES(ES):
    """ES that keeps every fitness vector it is told."""

    told: list[torch.Tensor] = field(default_factory=list, compare=False, repr=False)

    def tell(self, state: ESState, pop: Population, fitness: torch.Tensor) -> Any:
        self.told.append(fitness.clone())
        return super().tell(state, pop, fitness)


class Recorder(Callback):
    """Every record, and a copy of the mean it left (generation 0: the start)."""

    def __init__(self) -> None:
        self.records: list[GenerationRecord] = []
        self.means: list[list[torch.Tensor]] = []

    def on_generation_end(self, ctx: RunContext, record: GenerationRecord, state: ESState) -> None:
        self.records.append(record)
        self.means.append([t.clone() for t in state.mean])


@dataclass(frozen=True)
class Tiny:
    layout: LoraLayout
    engine: LocalEngine
    task: Echo


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: str) -> Tiny:
    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), LoraSpec())
    engine = LocalEngine(tiny_model_dir, layout, device="cpu")
    prompts = [e.prompt for e in Conciseness().eval[:6]]
    [base] = engine.generate(prompts, None, Sampling(TOKENS), 0)
    pairs = zip(prompts, base, strict=True)
    examples = [Example(prompt=p, reference={"base": str(b)}) for p, b in pairs]
    return Tiny(layout, engine, Echo(examples))


def run(
    tiny: Tiny, tmp_path: Path, sigma: float, train_mean: bool = True
) -> tuple[SpyES, Recorder, RunContext]:
    """Three generations of 4 members (zero-B start: the mean is the base model), watched by the
    health monitor."""
    spec = LoraSpec()
    es = SpyES(population_size=4, sigma=sigma, alpha=0.5, update="natural")
    scales = uniform_scales(tiny.layout)
    state = es.init(tiny.layout.init_mean(spec, scales, 0), 0, es_scales(spec, scales))
    recorder = Recorder()
    callbacks = [recorder, LearningMonitor(sigma=sigma)]
    loop = ESLoop(es, tiny.task, tiny.engine, tiny.layout, GENERATIONS, 100, 0, callbacks)
    loop = replace(loop, train_mean=train_mean)
    ctx = RunContext(tmp_path, GENERATIONS, tiny.layout, "tiny")
    loop.run(state, ctx)
    return es, recorder, ctx


def without_mean(record: GenerationRecord) -> dict[str, Any]:
    flat = record.as_record()
    mine = ("time/", "train/mean/", M.MEMBER_GAP)
    return {k: v for k, v in flat.items() if not k.startswith(mine)}


def noise_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    said = [r.getMessage() for r in caplog.records]
    return [m for m in said if "THE NOISE DESTROYS WHAT THE MEAN DOES" in m]


def test_the_means_rows_leave_the_members_trajectory_bit_equal(
    tiny: Tiny, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """train_mean on vs off: the members' fitness, every record number and each new mean are
    bit-equal for three generations; train/mean/* is what the mean alone scores on those rows;
    a healthy run (members near the mean) is not warned."""
    with caplog.at_level(logging.WARNING, logger="evolm.callbacks.health"):
        on, seen, ctx = run(tiny, tmp_path / "on", sigma=0.001)
    off, unseen, _ = run(tiny, tmp_path / "off", sigma=0.001, train_mean=False)
    assert len(on.told) == len(off.told) == GENERATIONS
    assert all(torch.equal(a, b) for a, b in zip(on.told, off.told, strict=True))
    assert len(set(on.told[0].tolist())) > 1, "the members differ: the test can see a change"
    for a, b in zip(seen.means, unseen.means, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(seen.means[0][1], seen.means[-1][1]), "the mean moved"
    for a, b in zip(seen.records, unseen.records, strict=True):
        assert without_mean(a) == without_mean(b)
    assert all(M.TRAIN_MEAN_REWARD not in r.as_record() for r in unseen.records)
    layout, examples = tiny.layout, tiny.task.train_examples(1)
    for g in range(1, GENERATIONS + 1):
        before = LoraPopulation.single(layout, seen.means[g - 1])
        alone = evaluate(tiny.engine, tiny.task, examples, before, seed=g)  # loop seed 0 + g
        record = seen.records[g].as_record()
        assert record[M.TRAIN_MEAN_REWARD] == alone.metrics["reward"]
        assert record["train/mean/accuracy"] == alone.metrics["accuracy"]
        gap = record[M.TRAIN_MEAN_REWARD] - seen.records[g].scores["reward"]
        assert record[M.MEMBER_GAP] == gap and record[M.MEMBER_GAP_SE] >= 0
    members = [r.scores["reward"] for r in seen.records[1:]]
    assert min(members) > 0.5, f"healthy: the members mostly answer as the mean ({members})"
    assert noise_warnings(caplog) == [] and TAG not in ctx.tags


def test_noise_that_breaks_the_members_is_measured_and_warned(
    tiny: Tiny, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """es.sigma=0.05 changes every member's answers while the mean keeps the base's: the gap is
    positive every generation, generation 1's mean (zero B) scores what the base model scores
    on those rows, and the monitor warns once, naming es.sigma and its value (and not that the
    tied members need a larger es.sigma)."""
    with caplog.at_level(logging.WARNING, logger="evolm.callbacks.health"):
        _, seen, ctx = run(tiny, tmp_path, sigma=0.05)
    records = [r.as_record() for r in seen.records[1:]]
    assert all(r[M.MEMBER_GAP] > 0.5 for r in records), records
    assert all(r[M.TRAIN_MEAN_REWARD] > r[M.FITNESS_MEAN] for r in records)
    base = evaluate(tiny.engine, tiny.task, tiny.task.train_examples(1), None, seed=1)
    assert records[0][M.TRAIN_MEAN_REWARD] == base.metrics["reward"] == 1.0
    [warning] = noise_warnings(caplog)
    assert "lower es.sigma (now 0.05)" in warning
    assert "train/mean/reward" in warning and "train/member_gap" in warning
    assert "the unperturbed mean 1 on the same rows" in warning
    # the members tie (all broken), but "raise es.sigma" would be the wrong advice
    assert not any("NOT LEARNING" in r.getMessage() for r in caplog.records)
    assert ctx.tags[TAG] == "noise_destroys"


# -- the split itself, without a model ---------------------------------------------------------
@pytest.mark.parametrize("row_scores", [True, False])
def test_each_part_is_scored_and_summarized_alone(row_scores: bool) -> None:
    """The members' evaluation beside an extra adapter equals theirs alone, also for a reward
    that compares rows (``row_scores=False``: the extra's rows would change it), and the
    extra's equals its own."""
    engine, task = LabelEngine(), LengthTask(row_scores)
    examples = task.train_examples(1)
    # labels 0 1 2, then 1 again: scored together, row_scores=False would count member 1 twice
    members, extra = population(3), population(3).subset([1])
    got, beside = evaluate_with_extra(engine, task, examples, members, extra, seed=0)
    for part, alone in (
        (got, evaluate(engine, task, examples, members, seed=0)),
        (beside, evaluate(engine, task, examples, extra, seed=0)),
    ):
        assert torch.equal(part.fitness, alone.fitness)
        assert part.metrics == alone.metrics and part.diagnostics == alone.diagnostics
        assert part.completions == alone.completions and part.scores == alone.scores
    assert got.diagnostics["rows"] == 9 and beside.diagnostics["rows"] == 3


def test_member_gap_se_is_paired_by_prompt() -> None:
    # the mean beats the members' average on each prompt by 1, 0.5, 0: differences' std 0.5
    se = member_gap_se([1.0, 0.0, 0.0, 1.0, 0.0, 0.0], [2.0, 0.5, 0.0])
    assert se == pytest.approx(0.5 / 3**0.5)
    assert math.isnan(member_gap_se([0.0, 0.0], [1.0]))  # one prompt: no error known


# -- the record, the progress line, the rule ---------------------------------------------------
def noisy(generation: int, mean: float, members: float, se: float) -> GenerationRecord:
    """A generation's record whose mean scored ``mean`` on its training rows, members
    ``members`` (their fitness), with the gap's standard error ``se``."""
    record = generation_record(generation, fitness_mean=members, fitness_std=0.01)
    return GenerationRecord(
        generation,
        record.es,
        scores={"reward": members, "accuracy": members},
        mean_scores={"reward": mean, "accuracy": mean},
        member_gap_se=se,
    )


def test_the_record_and_progress_line_carry_the_means_reward() -> None:
    record = noisy(2, mean=0.15, members=0.01, se=0.02)
    flat = record.as_record()
    assert flat[M.TRAIN_MEAN_REWARD] == 0.15 and flat["train/mean/accuracy"] == 0.15
    assert flat[M.MEMBER_GAP] == pytest.approx(0.14) and flat[M.MEMBER_GAP_SE] == 0.02
    assert flat["train/accuracy_mean"] == 0.01  # the members' own, unchanged
    assert "fitness 0.01 (std 0.01), mean 0.15, 0.0 s" in progress_line(record, 40)
    assert ", mean " not in progress_line(generation_record(2), 40)  # train_mean=false


def monitor_on(
    tmp_path: Path, records: Sequence[GenerationRecord], history: Sequence[GenerationRecord] = ()
) -> RunContext:
    monitor = LearningMonitor(sigma=0.002)
    ctx = RunContext(tmp_path, 10, LoraLayout((), 1, 1.0, 1), "m")
    ctx.history = [r.as_record() for r in history]
    monitor.on_run_start(ctx, None)  # type: ignore[arg-type]
    for record in records:
        monitor.on_generation_end(ctx, record, None)  # type: ignore[arg-type]
    return ctx


BROKEN = functools.partial(noisy, mean=0.15, members=0.01, se=0.02)  # gap 7 standard errors


@pytest.mark.parametrize(
    "last",
    [
        noisy(3, mean=0.15, members=0.01, se=0.05),  # a gap within 3 standard errors
        noisy(3, mean=0.15, members=0.09, se=0.01),  # members above half the mean's
        noisy(3, mean=-4.0, members=-5.0, se=0.01),  # below 0: a gap under half its size
        noisy(3, mean=0.01, members=-0.5, se=0.01),  # a mean about 0: no size to halve
        noisy(3, mean=0.15, members=0.01, se=float("nan")),  # one prompt: no error known
    ],
)
def test_the_noise_rule_needs_all_of_its_window(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, last: GenerationRecord
) -> None:
    with caplog.at_level(logging.WARNING):
        ctx = monitor_on(tmp_path, [BROKEN(1), BROKEN(2), last, BROKEN(4), BROKEN(5)])
    assert noise_warnings(caplog) == [] and TAG not in ctx.tags


def test_the_noise_rule_judges_a_reward_whose_best_is_0(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Conciseness (minus the length error): members at -58 where the mean scores -4 have lost
    more than half of what the mean does; the same gap within 3 standard errors (the demo's two
    prompts a generation) has not shown it."""
    broken = functools.partial(noisy, mean=-4.0, members=-58.0, se=1.0)
    with caplog.at_level(logging.WARNING):
        monitor_on(tmp_path, [broken(g) for g in range(1, 4)])
    [warning] = noise_warnings(caplog)
    assert "members score -58 on the training rows" in warning and "mean -4 on" in warning
    caplog.clear()
    within = functools.partial(noisy, mean=-4.0, members=-58.0, se=54.0)
    with caplog.at_level(logging.WARNING):
        monitor_on(tmp_path, [within(g) for g in range(1, 4)])
    assert noise_warnings(caplog) == []


def test_the_noise_rule_warns_once_and_a_resume_does_not_judge_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        ctx = monitor_on(tmp_path, [BROKEN(g) for g in range(1, 7)])
    [warning] = noise_warnings(caplog)
    assert warning.startswith("THE NOISE DESTROYS WHAT THE MEAN DOES: members score 0.01 on")
    assert "the unperturbed mean 0.15 on the same rows" in warning
    assert "generations 1-3" in warning and "lower es.sigma (now 0.002)" in warning
    assert ctx.tags[TAG] == "noise_destroys"
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # resumed at 3: the window was judged before
        monitor_on(tmp_path, [BROKEN(4)], history=[BROKEN(g) for g in range(1, 4)])
        assert noise_warnings(caplog) == []
        monitor_on(tmp_path, [BROKEN(3)], history=[BROKEN(1), BROKEN(2)])  # resumed at 2
    assert len(noise_warnings(caplog)) == 1
