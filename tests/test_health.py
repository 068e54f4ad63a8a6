"""A run that cannot learn says so: the health monitor's warning, MLflow tag and abort."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlflow
import pytest
from transformers import AutoConfig

from evolm.callbacks import GenerationRecord, RunContext
from evolm.callbacks.health import TAG, LearningMonitor
from evolm.callbacks.mlflow import MLflowLogger
from evolm.callbacks.results import ResultsWriter
from evolm.engine.local import LocalEngine
from evolm.errors import ConfigError, RunAborted
from evolm.es import ES
from evolm.loop import ESLoop
from evolm.lora import LoraLayout, LoraSpec, es_scales, uniform_scales
from evolm.task.base import Example, Scores
from evolm.task.conciseness import Conciseness
from evolm.task.countdown import Countdown
from tests.helpers import REPO, generation_record, read_results, run_cli
from tests.test_countdown_shortcuts import PUZZLES


def record(
    generation: int, std: float, update: float = 0.1, mean: float = -4.0
) -> GenerationRecord:
    return generation_record(generation, fitness_mean=mean, fitness_std=std, update_norm=update)


def context(tmp_path: Path) -> RunContext:
    return RunContext(tmp_path, 10, LoraLayout((), 1, 1.0, 1), "m")


def test_ties_are_reported_once_after_patience(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monitor, ctx = LearningMonitor(patience=2), context(tmp_path)
    monitor.on_run_start(ctx, None)  # type: ignore[arg-type]
    start = GenerationRecord(0, eval={"eval/reward_mean": 1.0})
    monitor.on_generation_end(ctx, start, None)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        monitor.on_generation_end(ctx, record(1, 0.0, 0.0), None)  # type: ignore[arg-type]
        assert not caplog.records and TAG not in ctx.tags
        monitor.on_generation_end(ctx, record(2, 0.0, 0.0), None)  # type: ignore[arg-type]
        monitor.on_generation_end(ctx, record(3, 0.0, 0.0), None)  # type: ignore[arg-type]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "NOT LEARNING" in warnings[0] and "es.sigma" in warnings[0]
    assert ctx.tags[TAG] == "members_tie"


def test_a_tie_after_learning_is_a_stall_not_a_dead_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Members that tie after generations with a signal (a converged or saturated run) are
    reported as a run that stopped learning, not one that never could."""
    monitor, ctx = LearningMonitor(patience=2), context(tmp_path)
    monitor.on_run_start(ctx, None)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        for g in range(1, 4):
            monitor.on_generation_end(ctx, record(g, 0.3), None)  # type: ignore[arg-type]
        for g in range(4, 7):
            monitor.on_generation_end(ctx, record(g, 0.0, 0.0), None)  # type: ignore[arg-type]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "STOPPED LEARNING" in warnings[0], warnings
    assert "after 3 generations with a signal" in warnings[0]
    assert ctx.tags[TAG] == "members_stalled"


def test_a_static_mean_and_non_finite_fitness_are_reported(tmp_path: Path) -> None:
    monitor, ctx = LearningMonitor(patience=1), context(tmp_path)
    monitor.on_generation_end(ctx, record(1, 0.5, update=0.0), None)  # type: ignore[arg-type]
    assert ctx.tags[TAG] == "mean_static"
    monitor.on_generation_end(ctx, record(2, float("nan"), mean=float("nan")), None)  # type: ignore[arg-type]
    assert ctx.tags[TAG] == "no_fitness"


def test_differing_members_are_healthy(tmp_path: Path) -> None:
    monitor, ctx = LearningMonitor(patience=1), context(tmp_path)
    for g in range(1, 5):
        monitor.on_generation_end(ctx, record(g, 0.3), None)  # type: ignore[arg-type]
    assert not ctx.tags


def test_abort_raises_with_the_reason(tmp_path: Path) -> None:
    monitor, ctx = LearningMonitor(patience=1, abort=True), context(tmp_path)
    with pytest.raises(RunAborted, match="every member scored the same"):
        monitor.on_generation_end(ctx, record(1, 0.0, 0.0), None)  # type: ignore[arg-type]


def shares(generation: int, mean: float, empty: float, truncated: float = 0.1) -> GenerationRecord:
    diagnostics = {"empty_share": empty, "truncated_share": truncated}
    return generation_record(generation, mean, 0.3, diagnostics=diagnostics)


def test_fitness_rising_with_empty_answers_is_reported_as_gaming(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monitor, ctx = LearningMonitor(patience=2), context(tmp_path)
    monitor.on_run_start(ctx, None)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        for g, (mean, empty) in enumerate([(-40, 0.0), (-30, 0.2), (-20, 0.3), (-10, 0.6)], 1):
            monitor.on_generation_end(ctx, shares(g, mean, empty), None)  # type: ignore[arg-type]
            assert (TAG in ctx.tags) == (g == 4), "two generations in a row at +0.25 or more"
    [warning] = [r.getMessage() for r in caplog.records]
    assert "THIS RUN IS GAMING ITS REWARD (train/empty_share)" in warning
    assert "fitness rose from -40 to -10" in warning and "rose from 0.00 to 0.60" in warning
    assert ctx.tags[TAG] == "gaming_empty"


def test_truncated_answers_are_watched_from_a_resumed_runs_first_generation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The baseline is the run's first generation, from the checkpoint's history on resume."""
    monitor, ctx = LearningMonitor(patience=1), context(tmp_path)
    ctx.history = [{"generation": 0}, shares(1, 0.1, 0.0, truncated=0.05).as_record()]
    monitor.on_run_start(ctx, None)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        monitor.on_generation_end(ctx, shares(2, 0.5, 0.0, truncated=0.5), None)  # type: ignore[arg-type]
    assert "GAMING ITS REWARD (train/truncated_share)" in caplog.records[0].getMessage()
    assert ctx.tags[TAG] == "gaming_truncated"


@pytest.mark.parametrize(
    ("mean", "empty"), [(-50.0, 0.9), (-10.0, 0.2)], ids=["fitness fell", "share rose little"]
)
def test_no_gaming_without_both_rises(tmp_path: Path, mean: float, empty: float) -> None:
    monitor, ctx = LearningMonitor(patience=1), context(tmp_path)
    monitor.on_generation_end(ctx, shares(1, -40.0, 0.0), None)  # type: ignore[arg-type]
    monitor.on_generation_end(ctx, shares(2, mean, empty), None)  # type: ignore[arg-type]
    assert not ctx.tags


def test_gaming_aborts_with_abort(tmp_path: Path) -> None:
    monitor, ctx = LearningMonitor(patience=1, abort=True), context(tmp_path)
    monitor.on_generation_end(ctx, shares(1, -40.0, 0.0), None)  # type: ignore[arg-type]
    with pytest.raises(RunAborted, match="share of empty completions"):
        monitor.on_generation_end(ctx, shares(2, -5.0, 1.0), None)  # type: ignore[arg-type]


def test_gaming_rise_out_of_range_names_the_key() -> None:
    with pytest.raises(ConfigError, match="gaming_rise"):
        LearningMonitor(gaming_rise=0.0)


def solving(generation: int, solved: float, std: float = 0.003) -> GenerationRecord:
    """A countdown generation: ``solved`` of the 76 training puzzles by some member."""
    diagnostics = {"pass_at_population": solved, "prompts": 76.0}
    return generation_record(generation, 0.04, std, diagnostics=diagnostics)


def test_members_that_never_answer_correctly_are_told_after_twenty_generations(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No member solves a training puzzle while the fitness still differs: the streak resets at
    a generation with a solve, and does not count ties (members_tie's); told once, at 20."""
    monitor, ctx = LearningMonitor(patience=3), context(tmp_path)
    monitor.on_run_start(ctx, None)  # type: ignore[arg-type]
    gens = [solving(1, 0.0), solving(2, 0.0, std=0.0), solving(3, 1 / 76)]
    gens += [solving(g, 0.0) for g in range(4, 26)]
    with caplog.at_level(logging.WARNING):
        for gen in gens:
            monitor.on_generation_end(ctx, gen, None)  # type: ignore[arg-type]
            assert (TAG in ctx.tags) == (gen.generation >= 23), gen.generation
    [warning] = [r.getMessage() for r in caplog.records]
    assert "THIS RUN NEVER ANSWERS CORRECTLY" in warning
    assert "any of the 76 training prompts correctly for 20 generations" in warning
    assert "train/pass_at_population = 0" in warning and "task.train_family" in warning
    assert ctx.tags[TAG] == "never_correct"


RESULTS = REPO / "docs/results/countdown-paper-split"


def replayed(path: Path) -> list[GenerationRecord]:
    """A committed run's training generations (results.jsonl), as the monitor got them."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [
        generation_record(
            int(r["generation"]),
            r["train/fitness_mean"],
            r["train/fitness_std"],
            r["es/update_norm"],
            {k: r[f"train/{k}"] for k in ("pass_at_population", "prompts")},
        )
        for r in records
        if "train/fitness_std" in r
    ]


def test_a_committed_run_that_never_solved_a_puzzle_is_told_and_one_that_did_is_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Replayed through the monitor, the records of two real 0.5B runs on an H100: zm (issue 36's
    session 30, the */÷ training puzzles alone; no member solved one in 90 generations) is told
    at its generation 20; z5s1 (session 27, 1-15% of its puzzles solved by some member) is not."""
    told: dict[str, list[tuple[float, str]]] = {}
    for name in ("session-30/zm.jsonl", "session-27/z5s1.jsonl"):
        monitor, ctx = LearningMonitor(patience=3), context(tmp_path)
        monitor.on_run_start(ctx, None)  # type: ignore[arg-type]
        told[name] = []
        for gen in replayed(RESULTS / name):
            caplog.clear()
            with caplog.at_level(logging.WARNING):
                monitor.on_generation_end(ctx, gen, None)  # type: ignore[arg-type]
            said = [m.getMessage() for m in caplog.records if "NEVER ANSWERS" in m.getMessage()]
            told[name] += [(gen.generation, message) for message in said]
    [(generation, message)] = told["session-30/zm.jsonl"]
    assert generation == 20 and "any of the 76 training prompts correctly for 20" in message
    assert told["session-27/z5s1.jsonl"] == []


class EmptyPays(Conciseness):
    """A reward built to be gamed: minus the completion's length, so answering nothing wins."""

    def score(self, examples: Sequence[Example], completions: Sequence[str]) -> Scores:
        return {"reward": [-float(len(c)) for c in completions]}


def test_a_run_paid_for_empty_answers_is_told_it_games_its_reward(
    tmp_path: Path, tiny_model_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The real tiny model, ES and MLflow store: within 20 generations (about 3 s) ES finds
    that the EOS first scores best; the monitor says so and tags the MLflow run."""
    spec = LoraSpec()
    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), spec)
    engine = LocalEngine(tiny_model_dir, layout, device="cpu")
    es = ES(population_size=16, sigma=0.01, alpha=2.0, update="natural")
    scales = uniform_scales(layout)
    state = es.init(layout.init_mean(spec, scales, 0), 0, es_scales(spec, scales))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    callbacks = [ResultsWriter(), LearningMonitor(patience=2), MLflowLogger(uri)]
    loop = ESLoop(es, EmptyPays(max_new_tokens=16), engine, layout, 20, 10, 0, callbacks)
    ctx = RunContext(tmp_path, 20, layout, tiny_model_dir)
    with caplog.at_level(logging.WARNING, logger="evolm.callbacks.health"):
        loop.run(state, ctx)
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "THIS RUN IS GAMING ITS REWARD (train/empty_share)" in said
    results = read_results(tmp_path)
    first, last = results[1], results[-1]
    assert last["train/fitness_mean"] > first["train/fitness_mean"] + 20
    assert last["train/empty_share"] >= first["train/empty_share"] + 0.25
    assert last["eval/empty_share"] >= 0.5, "the mean answers nothing"
    [run] = mlflow.MlflowClient(uri).search_runs(
        [mlflow.MlflowClient(uri).get_experiment_by_name("evolm").experiment_id]
    )
    assert run.data.tags[TAG] == "gaming_empty"


# A perturbation far too small to change any greedy output: every member ties.
FROZEN = ["es.sigma=1e-12", "generations=3", "eval_every=3", "es.population_size=4"]


def test_a_run_that_cannot_learn_warns_and_is_tagged(
    tmp_path: Path, tiny_model_dir: str, mlflow_store: str
) -> None:
    out = tmp_path / "run"
    proc = run_cli([*FROZEN, "callbacks.health.patience=2", f"hydra.run.dir={out}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = proc.stdout + proc.stderr  # Hydra's logging config writes to stdout
    assert "THIS RUN IS NOT LEARNING" in said and "es.sigma" in said
    assert all(r["train/fitness_std"] == 0 for r in read_results(out)[1:])
    runs = mlflow.MlflowClient(mlflow_store).search_runs(
        [mlflow.get_experiment_by_name("evolm").experiment_id],
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    assert runs[0].data.tags[TAG] == "members_tie"


@pytest.mark.slow  # make test-all
def test_abort_ends_the_run_with_one_message(tmp_path: Path, tiny_model_dir: str) -> None:
    out = tmp_path / "run"
    overrides = [*FROZEN, "callbacks.health.patience=1", "callbacks.health.abort=true"]
    proc = run_cli([*overrides, f"hydra.run.dir={out}", "logger=none"])
    assert proc.returncode == 3
    said = proc.stdout + proc.stderr
    assert "run aborted: every member scored the same" in said
    assert "Traceback" not in said


# -- a run that learns a shortcut (countdown's set-level numbers, issue 36) --------------------
@functools.cache
def countdown() -> Countdown:
    return Countdown(train_size=5, generate_count=12, samples_per_generation=2, eval_samples=None)


def countdown_eval(answers: Sequence[str | None]) -> dict[str, float]:
    """The eval metrics of the mean answering the hand-made puzzles of
    tests/test_countdown_shortcuts.py with ``answers`` (None: no answer), as the loop logs them."""
    task = countdown()
    examples = [Example(prompt="", reference={"numbers": n, "target": t}) for n, t in PUZZLES]
    texts = [" x" if a is None else f" x </think>\n<answer> {a} </answer>" for a in answers]
    scores = task.score(examples, texts)
    means = {f"eval/{k}_mean": sum(v) / len(v) for k, v in scores.items() if k[0] != "_"}
    return means | {f"eval/{k}": v for k, v in task.summarize(examples, scores).items()}


NOTHING = [None] * len(PUZZLES)
SUMS = [
    "44 + 19 + 35",
    "10 + 3 + 5",
    "3 + 10 + 5",
    "2 + 3 + 4",
    "1 + 2 + 3 + 4",
    None,
    "20 + 5 + 1",
]
SOLVED = ["44 + 19 + 35", None, "5 + 10 - 3", "(3 + 4) * 2", None, None, None]
# "5 + 10 - 3" for [3, 10, 5]: -a + b + c in no rule's order ("10 - 3 + 5" is the first-negated
# rule's, a template answer)


def evals(tmp_path: Path, *answers: Sequence[str | None], **kwargs: Any) -> RunContext:
    """The monitor fed the start's eval, then one generation with an eval per ``answers``."""
    monitor, ctx = LearningMonitor(**kwargs), context(tmp_path)
    monitor.on_run_start(ctx, None)  # type: ignore[arg-type]
    for g, given in enumerate(answers):
        ev = countdown_eval(given)
        generation = GenerationRecord(0, eval=ev) if g == 0 else replace(record(g, 0.3), eval=ev)
        monitor.on_generation_end(ctx, generation, None)  # type: ignore[arg-type]
    return ctx


def test_accuracy_that_rises_only_on_template_puzzles_is_a_shortcut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The mean learns to answer with the sum of the numbers: accuracy 0 -> 2/7 (the two sum
    puzzles), none of it on the puzzles no template solves: reported once, with the numbers."""
    with caplog.at_level(logging.WARNING):
        ctx = evals(tmp_path, NOTHING, SUMS, SUMS)
    [warning] = [r.getMessage() for r in caplog.records if r.name == "evolm.callbacks.health"]
    assert warning.startswith("THIS RUN IS LEARNING A SHORTCUT: held-out accuracy")
    assert "(eval/accuracy_mean) rose from 0.0% to 28.6%" in warning
    assert "(eval/accuracy_beyond_shortcuts) went from 0.0% to 0.0%" in warning
    assert "100.0% of the correct answers are template answers (eval/template_share)" in warning
    assert "the best fixed rule alone scores 42.9% on these puzzles" in warning  # 3 of 7
    # the sums' forms: 1/6 on five 3-number puzzles and SUM4's 1 of 1, none for no answer
    assert "would score 26.2% (eval/blind_accuracy: accuracy lift 0.0% -> 2.4%)" in warning
    assert f"{tmp_path}/samples/gen-*.jsonl" in warning and ctx.tags[TAG] == "shortcut"


def test_accuracy_that_rises_beyond_shortcuts_too_is_not_a_shortcut(tmp_path: Path) -> None:
    """Solving a sum, a +/- puzzle out of order and a needs-* one: accuracy 3/7, 2/3 on the
    puzzles no template solves, 1 of 3 correct answers a template answer: healthy."""
    assert not evals(tmp_path, NOTHING, SOLVED).tags
    assert not evals(tmp_path, NOTHING, NOTHING).tags  # no rise at all


def test_a_shortcut_is_told_from_the_lift_where_the_templates_look_fine(tmp_path: Path) -> None:
    """Sums everywhere but one out-of-order +/- puzzle: beyond shortcuts rose by a third of the
    accuracy and 3 of 7 is as much as the best fixed rule, yet the sums' forms, written blindly,
    score 2 of the 3: the lift (a third of the rise) says shortcut."""
    mostly_sums = [*SUMS[:2], "5 + 10 - 3", *SUMS[3:]]  # 1 of 3 non-template puzzles solved
    ev = countdown_eval(mostly_sums)
    assert ev["eval/accuracy_beyond_shortcuts"] == 1 / 3 and ev["eval/template_share"] == 2 / 3
    assert ev["eval/accuracy_mean"] == ev["eval/shortcut_accuracy"] == 3 / 7
    assert ev["eval/accuracy_lift"] == pytest.approx(1 / 7)
    assert evals(tmp_path, NOTHING, mostly_sums).tags[TAG] == "shortcut"
    with pytest.raises(RunAborted, match=r"rose from 0\.0% to 28\.6%"):
        evals(tmp_path, NOTHING, SUMS, abort=True)


def test_without_a_lift_the_template_figures_decide(tmp_path: Path) -> None:
    """An eval that reports no accuracy lift (a task without the blind baseline) is judged by
    the proxies: the share of template answers, and the best fixed rule."""
    first = {"eval/accuracy_mean": 0.0, "eval/accuracy_beyond_shortcuts": 0.0}
    now = {"eval/accuracy_mean": 0.3, "eval/accuracy_beyond_shortcuts": 0.1}  # a third: enough
    for extra, reported in (
        ({"eval/template_share": 0.95}, True),
        ({"eval/template_share": 0.85}, False),
        ({"eval/shortcut_accuracy": 0.35}, True),  # below one fixed rule
        ({"eval/shortcut_accuracy": 0.25}, False),
    ):
        monitor, ctx = LearningMonitor(), context(tmp_path)
        monitor.on_generation_end(ctx, GenerationRecord(0, eval=first), None)  # type: ignore[arg-type]
        later = replace(record(1, 0.3), eval={**now, **extra})
        monitor.on_generation_end(ctx, later, None)  # type: ignore[arg-type]
        assert (TAG in ctx.tags) == reported, extra


def test_a_search_the_lift_explains_is_not_a_shortcut(tmp_path: Path) -> None:
    """Issue 36's 1.5B under the paper's effective reward, generation 12 (its figures): below
    the best fixed rule, 56% of its correct answers template-shaped, beyond shortcuts up by
    less than a third, but the lift rose with the accuracy: the model checks candidates
    against the target. The same figures with the lift flat are a shortcut."""
    first = {"eval/accuracy_mean": 0.0255, "eval/accuracy_beyond_shortcuts": 0.008,
             "eval/template_share": 0.843, "eval/accuracy_lift": 0.0112}  # fmt: skip
    now = {"eval/accuracy_mean": 0.174, "eval/accuracy_beyond_shortcuts": 0.052,
           "eval/template_share": 0.56, "eval/shortcut_accuracy": 0.175}  # fmt: skip
    for lift, reported in ((0.128, False), (0.03, True)):
        monitor, ctx = LearningMonitor(), context(tmp_path)
        monitor.on_generation_end(ctx, GenerationRecord(0, eval=first), None)  # type: ignore[arg-type]
        later = replace(record(1, 0.3), eval={**now, "eval/accuracy_lift": lift})
        monitor.on_generation_end(ctx, later, None)  # type: ignore[arg-type]
        assert (TAG in ctx.tags) == reported, lift


def test_accuracy_that_the_answers_forms_explain_is_a_shortcut(tmp_path: Path) -> None:
    """Beyond shortcuts rose with the accuracy, few correct answers are template answers, no
    fixed rule scores as much: only the accuracy lift (what the mean's own forms, written
    without reading the target, do not explain) tells a model that writes a few rules blindly
    from one that chooses per puzzle."""
    for lift, reported in ((0.02, True), (0.2, False)):
        monitor, ctx = LearningMonitor(), context(tmp_path)
        first = {"eval/accuracy_mean": 0.0, "eval/accuracy_beyond_shortcuts": 0.0,
                 "eval/accuracy_lift": 0.0, "eval/template_share": 0.0}  # fmt: skip
        now = {"eval/accuracy_mean": 0.3, "eval/accuracy_beyond_shortcuts": 0.3,
               "eval/accuracy_lift": lift, "eval/blind_accuracy": 0.3 - lift}  # fmt: skip
        monitor.on_generation_end(ctx, GenerationRecord(0, eval=first), None)  # type: ignore[arg-type]
        monitor.on_generation_end(ctx, replace(record(1, 0.3), eval=now), None)  # type: ignore[arg-type]
        assert (TAG in ctx.tags) == reported, lift


def test_a_run_without_a_start_eval_is_judged_from_zero(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """eval_start=false (issue 36's seed-1 runs, their figures): the 0.5B's only eval, 9.6% with
    a lift of -2.5 points, is a shortcut; the 1.5B's, 31.85% with a lift of +24.8, is not. The
    same holds when such a run is resumed (its history starts with generation 0, no eval)."""
    for acc, lift, reported in ((0.096, -0.025, True), (0.3185, 0.248, False)):
        now = {"eval/accuracy_mean": acc, "eval/accuracy_lift": lift}
        monitor, ctx = LearningMonitor(), context(tmp_path)
        caplog.clear()
        monitor.on_generation_end(ctx, GenerationRecord(0), None)  # type: ignore[arg-type]
        monitor.on_generation_end(ctx, replace(record(63, 0.1), eval=now), None)  # type: ignore[arg-type]
        assert (TAG in ctx.tags) == reported, acc
        said = "rose from 0.0% (the start was not evaluated, eval_start=false: taken as 0) to"
        assert (said in caplog.text) == reported
        resumed, ctx = LearningMonitor(), context(tmp_path)
        ctx.history = [{"generation": 0}, {"generation": 1, "train/fitness_mean": 0.0}]
        resumed.on_run_start(ctx, None)  # type: ignore[arg-type]
        resumed.on_generation_end(ctx, replace(record(63, 0.1), eval=now), None)  # type: ignore[arg-type]
        assert (TAG in ctx.tags) == reported, acc


def test_an_accuracy_change_within_its_sampling_error_is_not_judged(tmp_path: Path) -> None:
    """The tiny model's countdown demo: 0 of 32 held-out puzzles -> 1 of 32, a sum, while one
    fixed rule scores 25%. That is 0.6 standard errors (eval/prompts: 32), not a rise; the same
    shares on the paper's 2,000 test puzzles are 7.9, a shortcut. Records without eval/prompts
    (written before it) are judged as before. A fall from 1 of 32 to none, twice, with the
    fitness risen, is not a fall either but an accuracy that stayed flat; from 2.5% of 2,000 it
    is a fall."""
    first = {"eval/accuracy_mean": 0.0, "eval/accuracy_beyond_shortcuts": 0.0,
             "eval/accuracy_lift": 0.0}  # fmt: skip
    now = {"eval/accuracy_mean": 1 / 32, "eval/accuracy_beyond_shortcuts": 0.0,
           "eval/accuracy_lift": 0.0, "eval/template_share": 1.0,
           "eval/shortcut_accuracy": 0.25}  # fmt: skip
    for prompts, reported in ((32, False), (2000, True), (None, True)):
        size = {} if prompts is None else {"eval/prompts": float(prompts)}
        monitor, ctx = LearningMonitor(), context(tmp_path)
        monitor.on_generation_end(ctx, GenerationRecord(0, eval=first | size), None)  # type: ignore[arg-type]
        monitor.on_generation_end(ctx, replace(record(1, 0.3), eval=now | size), None)  # type: ignore[arg-type]
        assert (ctx.tags.get(TAG) == "shortcut") == reported, prompts
    # a first eval logged before eval/prompts is taken to be of the current one's size
    monitor, ctx = LearningMonitor(), context(tmp_path)
    monitor.on_generation_end(ctx, GenerationRecord(0, eval=first), None)  # type: ignore[arg-type]
    sized = now | {"eval/prompts": 32.0}
    monitor.on_generation_end(ctx, replace(record(1, 0.3), eval=sized), None)  # type: ignore[arg-type]
    assert TAG not in ctx.tags
    for prompts, start, told in ((32, 1 / 32, "accuracy_flat"), (2000, 0.025, "accuracy_fell")):
        size = {"eval/prompts": float(prompts)}
        monitor, ctx = LearningMonitor(), context(tmp_path)
        start_eval = GenerationRecord(0, eval={"eval/accuracy_mean": start} | size)
        monitor.on_generation_end(ctx, start_eval, None)  # type: ignore[arg-type]
        monitor.on_generation_end(ctx, record(1, 0.01, mean=0.06), None)  # type: ignore[arg-type]
        for g in (2, 3):
            none = {"eval/accuracy_mean": 0.0} | size
            monitor.on_generation_end(ctx, replace(record(g, 0.01, mean=0.1), eval=none), None)  # type: ignore[arg-type]
        assert ctx.tags[TAG] == told, prompts


def test_the_shortcut_baseline_is_a_resumed_runs_first_eval(tmp_path: Path) -> None:
    monitor, ctx = LearningMonitor(), context(tmp_path)
    ctx.history = [{"generation": 0, **countdown_eval(NOTHING)}]
    monitor.on_run_start(ctx, None)  # type: ignore[arg-type]
    later = replace(record(5, 0.3), eval=countdown_eval(SUMS))
    monitor.on_generation_end(ctx, later, None)  # type: ignore[arg-type]
    assert ctx.tags[TAG] == "shortcut"


def test_shortcut_rise_out_of_range_names_the_key() -> None:
    with pytest.raises(ConfigError, match="shortcut_rise"):
        LearningMonitor(shortcut_rise=0.0)


def test_accuracy_falling_while_fitness_rises_is_reported_at_the_second_eval(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 36's bb0: the blind-baseline reward left only the format reward to climb; fitness
    rose to 0.1 while held-out accuracy fell from 2.5% to 0.0%. One such eval can be noise;
    two in a row are reported (once), quoting the numbers."""

    def run(*evals: tuple[float, float], abort: bool = False) -> RunContext:
        monitor, ctx = LearningMonitor(abort=abort), context(tmp_path)
        monitor.on_run_start(ctx, None)  # type: ignore[arg-type]
        start = GenerationRecord(0, eval={"eval/accuracy_mean": 0.025})
        monitor.on_generation_end(ctx, start, None)  # type: ignore[arg-type]
        monitor.on_generation_end(ctx, record(1, 0.01, mean=0.06), None)  # type: ignore[arg-type]
        for g, (fitness, accuracy) in enumerate(evals, 2):
            later = replace(record(g, 0.01, mean=fitness), eval={"eval/accuracy_mean": accuracy})
            monitor.on_generation_end(ctx, later, None)  # type: ignore[arg-type]
        return ctx

    with caplog.at_level(logging.WARNING):
        assert not run((0.1, 0.0)).tags  # one eval
        ctx = run((0.1, 0.0), (0.1, 0.005), (0.1, 0.0))
    [warning] = [r.getMessage() for r in caplog.records if r.name == "evolm.callbacks.health"]
    assert warning.startswith("THIS RUN IS GAMING ITS REWARD (eval/accuracy_mean)")
    assert "fitness rose from 0.06 to 0.1" in warning and "fell from 2.5% to 0.5%" in warning
    assert ctx.tags[TAG] == "accuracy_fell"
    assert not run((0.1, 0.0), (0.1, 0.05), (0.1, 0.0)).tags  # not in a row (2.5% -> 5% between)
    assert run((0.1, 0.015), (0.1, 0.015)).tags[TAG] == "accuracy_flat"  # fell < 2 points
    assert not run((0.05, 0.0), (0.05, 0.0)).tags  # the fitness did not rise
    with pytest.raises(RunAborted, match=r"fell from 2\.5% to 0\.0%"):
        run((0.1, 0.0), (0.1, 0.0), abort=True)


def test_fitness_rising_while_accuracy_stays_flat_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 36's 0.5B with the blind baseline and a 0.02 format weight (session 9's r0): the
    fitness rose from 0.0106 (spread 0.0043) to 0.0195 while every answer became ``(a + b) / 3``
    and the held-out accuracy stayed at 0.0% -> 0.05%. A fitness rise smaller than the first
    generation's spread, or an accuracy that rose with it, is not reported."""

    def accuracy_of(accuracy: float) -> dict[str, float]:
        return {"eval/accuracy_mean": accuracy}

    def run(*evals: tuple[float, float], start_accuracy: float = 0.0) -> RunContext:
        monitor, ctx = LearningMonitor(), context(tmp_path)
        monitor.on_run_start(ctx, None)  # type: ignore[arg-type]
        start = GenerationRecord(0, eval=accuracy_of(start_accuracy))
        monitor.on_generation_end(ctx, start, None)  # type: ignore[arg-type]
        first = replace(record(1, 0.0043, mean=0.0106), scores={"accuracy": 0.0})
        monitor.on_generation_end(ctx, first, None)  # type: ignore[arg-type]
        for g, (fitness, accuracy) in enumerate(evals, 2):
            later = replace(
                record(g, 0.004, mean=fitness),
                scores={"accuracy": 0.0003},
                eval=accuracy_of(accuracy),
            )
            monitor.on_generation_end(ctx, later, None)  # type: ignore[arg-type]
        return ctx

    with caplog.at_level(logging.WARNING):
        ctx = run((0.0195, 0.0005), (0.0199, 0.0005))
    [warning] = [r.getMessage() for r in caplog.records if r.name == "evolm.callbacks.health"]
    assert warning.startswith("THIS RUN IS GAMING ITS REWARD (eval/accuracy_mean)")
    assert "fitness rose from 0.0106 to 0.0199" in warning and "spread" in warning
    assert "went from 0.0% to 0.1%" in warning and "train/accuracy_mean: 0.0% -> 0.0%" in warning
    assert ctx.tags[TAG] == "accuracy_flat"
    assert not run((0.0195, 0.0005)).tags  # one evaluation can be noise
    assert not run((0.0140, 0.0), (0.0140, 0.0)).tags  # rose by less than the spread
    # the accuracy rose with the fitness (p0 of session 5: 2.55% -> 17.4%)
    assert not run((0.05, 0.174), (0.08, 0.25), start_accuracy=0.0255).tags


def test_the_flat_rule_weighs_the_first_spread_not_a_first_tie(tmp_path: Path) -> None:
    """Members of generation 1 that all tie (spread 0) are no yardstick: a fitness rise is
    weighed against the first generation whose members differ (here 0.05), from history on a
    resume too; a run that never had a spread is not judged."""

    def run(
        rise: float, spreads: tuple[float, ...] = (0.0, 0.05), resumed: bool = False
    ) -> RunContext:
        monitor, ctx = LearningMonitor(), context(tmp_path)
        before = [record(g, std, mean=0.33).as_record() for g, std in enumerate(spreads, 1)]
        ctx.history = [{"generation": 0, "eval/accuracy_mean": 0.1}, *before] if resumed else []
        monitor.on_run_start(ctx, None)  # type: ignore[arg-type]
        if not resumed:
            start = GenerationRecord(0, eval={"eval/accuracy_mean": 0.1})
            monitor.on_generation_end(ctx, start, None)  # type: ignore[arg-type]
            for g, std in enumerate(spreads, 1):
                monitor.on_generation_end(ctx, record(g, std, mean=0.33), None)  # type: ignore[arg-type]
        for g in (len(spreads) + 1, len(spreads) + 2):
            now = {"eval/accuracy_mean": 0.1}
            later = replace(record(g, spreads[-1], mean=0.33 + rise), eval=now)
            monitor.on_generation_end(ctx, later, None)  # type: ignore[arg-type]
        return ctx

    assert TAG not in run(0.02).tags  # under the first spread (0.05), though over gen 1's 0
    assert run(0.06).tags[TAG] == "accuracy_flat"
    assert TAG not in run(0.02, resumed=True).tags
    assert run(0.06, resumed=True).tags[TAG] == "accuracy_flat"
    # no spread yet (every generation a tie): not judged (the ties are reported instead)
    assert run(0.06, spreads=(0.0, 0.0)).tags[TAG] == "members_tie"


def test_an_accuracy_rise_within_its_sampling_error_is_flat(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The tiny model's countdown demo (``python -m evolm task=countdown es.sigma=0.001``): its
    fitness, the format reward, rose 0.33 -> 0.72 while the held-out accuracy went 0 -> 1 of 32
    puzzles, every answer the sum of the numbers, and nothing was said. 1 of 32 is under
    RISE_Z standard errors of the change, so the accuracy counts as flat; 3 points of 2,000
    puzzles (over shortcut_rise, many standard errors) is a rise."""

    def run(accuracy: float, prompts: int) -> RunContext:
        size = {"eval/prompts": float(prompts)}
        monitor, ctx = LearningMonitor(), context(tmp_path)
        monitor.on_run_start(ctx, None)  # type: ignore[arg-type]
        start = GenerationRecord(0, eval={"eval/accuracy_mean": 0.0} | size)
        monitor.on_generation_end(ctx, start, None)  # type: ignore[arg-type]
        monitor.on_generation_end(ctx, record(1, 0.05, mean=0.33), None)  # type: ignore[arg-type]
        for g in (2, 3):
            now = {"eval/accuracy_mean": accuracy} | size
            monitor.on_generation_end(ctx, replace(record(g, 0.05, mean=0.72), eval=now), None)  # type: ignore[arg-type]
        return ctx

    with caplog.at_level(logging.WARNING):
        assert run(1 / 32, 32).tags[TAG] == "accuracy_flat"
    [warning] = [r.getMessage() for r in caplog.records if r.name == "evolm.callbacks.health"]
    assert "went from 0.0% to 3.1%" in warning
    assert "a rise of 3.1%, 0.6 standard errors of 32 held-out puzzles" in warning
    assert "task.eval_samples" in warning
    assert run(3 / 32, 32).tags[TAG] == "accuracy_flat"  # 9.4 points: 1.5 standard errors
    assert TAG not in run(0.03, 2000).tags
    assert TAG not in run(6 / 32, 32).tags  # 18.8 points, 2.5 standard errors: a rise


def test_a_held_out_reward_rising_while_accuracy_stays_flat_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The tiny model's countdown demo on an earlier build: the fitness rose 0.072 -> 0.093,
    under its first spread across members (0.029), while the mean's reward on the 32 held-out
    puzzles rose 0.069 -> 0.112 (the format, 0.38 -> 0.80) and its accuracy stayed at 1 of 32,
    every answer the sum of the numbers: the held-out reward's rise counts as the fitness's
    would, also where the evaluated generations' fitness is under the first's (session 32's
    build: each generation's puzzles differ). A held-out reward that rose less than the spread,
    or an accuracy that rose with it, is not reported."""

    def run(reward: float, accuracy: float = 1 / 32, fitness: float = 0.093) -> RunContext:
        def held_out(reward: float, accuracy: float) -> dict[str, float]:
            return {"eval/accuracy_mean": accuracy, "eval/reward_mean": reward, "eval/prompts": 32}

        monitor, ctx = LearningMonitor(), context(tmp_path)
        monitor.on_run_start(ctx, None)  # type: ignore[arg-type]
        start = GenerationRecord(0, eval=held_out(0.069, 1 / 32))
        monitor.on_generation_end(ctx, start, None)  # type: ignore[arg-type]
        monitor.on_generation_end(ctx, record(1, 0.029, mean=0.072), None)  # type: ignore[arg-type]
        for g in (2, 3):
            later = replace(record(g, 0.02, mean=fitness), eval=held_out(reward, accuracy))
            monitor.on_generation_end(ctx, later, None)  # type: ignore[arg-type]
        return ctx

    with caplog.at_level(logging.WARNING):
        ctx = run(0.112)
    [warning] = [r.getMessage() for r in caplog.records if r.name == "evolm.callbacks.health"]
    assert warning.startswith("THIS RUN IS GAMING ITS REWARD (eval/accuracy_mean)")
    assert "held-out reward (eval/reward_mean) from 0.069 to 0.112" in warning
    assert "went from 3.1% to 3.1%" in warning
    assert ctx.tags[TAG] == "accuracy_flat"
    assert TAG not in run(0.09).tags  # the held-out reward rose 0.021, under the spread
    assert TAG not in run(0.112, accuracy=7 / 32).tags  # 18.8 points, 2.5 standard errors
    # session 32's build: the evaluated generations' fitness under the first's (other puzzles)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert run(0.112, fitness=0.06).tags[TAG] == "accuracy_flat"
    [warning] = [r.getMessage() for r in caplog.records if r.name == "evolm.callbacks.health"]
    assert "fitness went from 0.072 to 0.06" in warning
    assert TAG not in run(0.09, fitness=0.06).tags
