"""The ES loop: ask -> build member adapters -> evaluate all at once -> shape -> tell.

Reads no config and writes no files: everything observable goes through callbacks
(:class:`evolm.callbacks.Callback`, each generation's typed
:class:`~evolm.callbacks.GenerationRecord`), so logging and checkpointing plug in without
touching the loop.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from evolm import metrics as M
from evolm.callbacks.base import Callback, RunContext, Sample, latest_eval
from evolm.callbacks.record import GenerationRecord, Record
from evolm.diagnostics import member_gap_se, pair_agreement
from evolm.dist import SINGLE, Comm
from evolm.engine.base import Engine
from evolm.errors import RunAborted
from evolm.es import ES, ESState, Population, TellStats
from evolm.evaluate import Evaluation, evaluate, evaluate_with_extra, kl_to_base, render
from evolm.interrupt import deferred
from evolm.lora.layout import LoraLayout, LoraPopulation
from evolm.lora.norms import delta_norm
from evolm.task.base import Task, eval_sampling

log = logging.getLogger(__name__)


def generation_diagnostics(ev: Evaluation, pop: Population) -> dict[str, float]:
    """The population's diagnostics (:mod:`evolm.diagnostics`), with the antithetic pairs'
    agreement (``pair_agreement``) when the population has pairs."""
    agreement = pair_agreement(ev.fitness, pop.seeds, pop.signs)
    pairs = {} if agreement is None else {M.PAIR_AGREEMENT: agreement}
    return {**ev.diagnostics, **pairs}


def mean_fields(ev: Evaluation, mean_ev: Evaluation | None) -> dict[str, Any]:
    """The record's fields of the mean's evaluation on the members' training rows
    (``mean_scores``, ``member_gap_se``); none without one (``train_mean=false``)."""
    if mean_ev is None:
        return {}
    se = member_gap_se(ev.scores["reward"], mean_ev.scores["reward"])
    return {"mean_scores": mean_ev.metrics, "member_gap_se": se}


def eval_metrics(
    engine: Engine,
    task: Task,
    adapter: LoraPopulation,
    seed: int,
    comm: Comm = SINGLE,
    extra_evals: Mapping[str, Task] | None = None,
    kl: bool = True,
) -> tuple[Record, Evaluation, dict[str, Evaluation]]:
    """The eval metrics of one adapter on ``task``'s eval split (``eval/*`` names, what every
    eval of the ES mean logs; ``time/eval_s`` aside): the task's scores and diagnostics, its KL
    to the base (``kl``, where the engine scores it) and every extra eval task's
    (``eval/<name>/*``: what training costs on tasks it does not train). Then the evaluations
    themselves: the task's, and each extra eval task's by name."""
    examples = task.eval_examples()
    ev = evaluate(engine, task, examples, adapter, seed, comm, eval_sampling(task))
    metrics = {M.eval_score(k): v for k, v in ev.metrics.items()}
    metrics |= {M.eval_diagnostic(k): v for k, v in ev.diagnostics.items()}
    if kl:
        found = kl_to_base(engine, examples, ev.completions[0], adapter, comm)
        metrics |= {M.eval_diagnostic(k): v for k, v in found.items()}
    extras: dict[str, Evaluation] = {}
    for name, extra_task in (extra_evals or {}).items():
        extras[name] = extra = evaluate(
            engine,
            extra_task,
            extra_task.eval_examples(),
            adapter,
            seed,
            comm,
            eval_sampling(extra_task),
        )
        metrics |= {M.extra_eval_score(name, k): v for k, v in extra.metrics.items()}
        metrics |= {M.extra_eval_diagnostic(name, k): v for k, v in extra.diagnostics.items()}
    return metrics, ev, extras


def eval_samples(
    engine: Engine, task: Task, ev: Evaluation, rows: Sequence[int], eval_set: str = ""
) -> list[Sample]:
    """The eval prompts ``rows`` (as the model saw them) with the adapter's completion and
    scores in ``ev`` (:func:`eval_metrics`' evaluation of ``task``; ``eval_set``: its name
    among the extra evals): what :class:`SampleWriter` writes."""
    examples = task.eval_examples()
    return [
        Sample(
            render(engine, examples[p]),
            ev.completions[0][p],
            {k: v[p] for k, v in ev.scores.items()},
            eval_set,
        )
        for p in rows
    ]


def all_eval_samples(
    engine: Engine,
    task: Task,
    ev: Evaluation,
    extra_evals: Mapping[str, Task] | None,
    extras: Mapping[str, Evaluation],
    comm: Comm = SINGLE,
) -> list[Sample]:
    """:func:`eval_samples` of the task's eval split, then of each extra eval task (this
    process's rows of each): every answer of one :func:`eval_metrics` call."""
    sets = [("", task, ev)] + [(n, t, extras[n]) for n, t in (extra_evals or {}).items()]
    return [
        sample
        for name, t, e in sets
        for sample in eval_samples(engine, t, e, comm.shard(range(len(t.eval_examples()))), name)
    ]


def check_finite_mean(mean_norm: float, generation: int, strategy: ES) -> None:
    """Stop the run (before the generation is logged or checkpointed) once the ES mean holds a
    NaN or an infinity: every later generation, checkpoint and adapter would be garbage."""
    if not math.isfinite(mean_norm):
        raise RunAborted(
            f"the ES mean became non-finite (norm {mean_norm}) in generation {generation}: the "
            f"update diverged (es.alpha={strategy.alpha}, es.sigma={strategy.sigma}). Fix: lower "
            "es.alpha or es.sigma, or use es.shaping=centered_ranks; nothing of this generation "
            "was saved (the last checkpoint is the last finite mean)"
        )


@dataclass
class TrainClock:
    """Training time (the sum of ``time/generation_s``: generate, score, update; evals,
    checkpoints and start-up excluded) against a budget and evaluation marks, both optional.

    ``eval_every_s``: an evaluation is due at the first generation that ends at or after each
    multiple of it. ``budget_s``: the run stops after the first generation that brings the
    training time to at least it. ``train_s`` starts from the time already spent (a resumed run).
    """

    budget_s: float | None = None
    eval_every_s: float | None = None
    train_s: float = 0.0

    def __post_init__(self) -> None:
        every = self.eval_every_s
        self.next_mark = math.inf if every is None else (self.train_s // every + 1) * every

    @property
    def timed(self) -> bool:
        return self.budget_s is not None or self.eval_every_s is not None

    def out_of_time(self) -> bool:
        return self.budget_s is not None and self.train_s >= self.budget_s

    def tick(self, seconds: float) -> bool:
        """Count one generation's ``seconds``; True when an evaluation mark was passed."""
        self.train_s += seconds
        if self.train_s < self.next_mark:
            return False
        assert self.eval_every_s is not None
        self.next_mark = (self.train_s // self.eval_every_s + 1) * self.eval_every_s
        return True


@dataclass
class ESLoop:
    """Runs ``generations`` ES updates from ``state``; evaluates the mean on the eval split at
    the start (unless ``eval_start`` is False), every ``eval_every`` generations (or, with
    ``eval_every_s``, every that many seconds of training time instead) and at the end. With
    ``time_budget_s`` it ends after the first generation that brings the training time
    (:class:`TrainClock`) to the budget. With ``train_mean`` the unperturbed mean answers each
    generation's training rows in the members' engine call (one more adapter), scored apart:
    the record's ``mean_scores``; the members' fitness, the update and every other number are
    the members' alone."""

    strategy: ES  # or a subclass (es.mean=full's FullES: the engine's base weights are the mean)
    task: Task
    engine: Engine
    layout: LoraLayout
    generations: int
    eval_every: int
    seed: int
    callbacks: Sequence[Callback] = ()
    comm: Comm = SINGLE  # a process group: rows sharded over ranks, the mean checked after tells
    base_norm: float | None = None  # of the adapted base weights: es/update_rel, es/mean_rel
    extra_evals: Mapping[str, Task] = field(default_factory=dict)  # eval/<name>/<score>_mean...
    time_budget_s: float | None = None  # stop once the training time reaches it
    eval_every_s: float | None = None  # evaluate at training-time marks instead of eval_every
    eval_start: bool = True  # False: no eval of the start (another seed of the same base has it)
    train_mean: bool = True  # the mean answers the training rows too: train/mean/*, member_gap

    def evaluate_mean(self, state: ESState) -> tuple[Record, list[Sample]]:
        """The eval metrics of the mean, and the samples callbacks get (``on_eval``)."""
        start = time.perf_counter()
        mean = LoraPopulation.single(self.layout, self.strategy.mean_adapter(state))
        metrics, ev, extras = eval_metrics(
            self.engine,
            self.task,
            mean,
            self.seed,
            self.comm,
            self.extra_evals,
            kl=not self.strategy.moves_base,  # a base that IS the mean: its KL to itself is moot
        )
        samples = all_eval_samples(self.engine, self.task, ev, self.extra_evals, extras, self.comm)
        return {**metrics, M.EVAL_S: time.perf_counter() - start}, samples

    def evaluate_population(
        self, state: ESState, adapters: LoraPopulation, generation: int
    ) -> tuple[Evaluation, Evaluation | None]:
        """The members' evaluation on the generation's training rows and, with ``train_mean``,
        the mean's on the same rows, generated in the same engine call (the mean's adapter
        last, so the members' rows, ranks and decoding seed are as without it) and scored
        apart (:func:`~evolm.evaluate.evaluate_with_extra`)."""
        examples = self.task.train_examples(generation)
        seed = self.seed + generation
        if not self.train_mean:
            return evaluate(self.engine, self.task, examples, adapters, seed, self.comm), None
        mean = LoraPopulation.single(self.layout, self.strategy.mean_adapter(state))
        return evaluate_with_extra(
            self.engine, self.task, examples, adapters, mean, seed, self.comm
        )

    def weight_change(self, before: ESState, after: ESState, stats: TellStats) -> dict[str, float]:
        """es/update_rel and es/mean_rel (:mod:`evolm.lora.norms`): the update's and the mean's
        change to the adapted weights, relative to them (none without ``base_norm``; the mean's
        only where the strategy knows it: :meth:`ES.weight_change`)."""
        if not self.base_norm:
            return {}
        step, total = self.strategy.weight_change(
            before, after, stats, functools.partial(delta_norm, self.layout)
        )
        out = {M.UPDATE_REL: step / self.base_norm}
        return out if total is None else {**out, M.MEAN_REL: total / self.base_norm}

    def step(self, state: ESState) -> tuple[ESState, GenerationRecord]:
        """One generation: returns the new state and its record (without eval metrics)."""
        start = time.perf_counter()
        generation, before = state.generation + 1, state
        pop = self.strategy.ask(state)
        adapters = LoraPopulation(self.layout, tuple(self.strategy.sample(state, pop)))
        sampled = time.perf_counter()
        ev, mean_ev = self.evaluate_population(state, adapters, generation)
        told = time.perf_counter()
        timings = dict(self.engine.last_timings)  # prefill/decode; servers: adapter I/O
        with deferred():  # a tell in place (full mode): the mean and the engine move together
            state, stats = self.strategy.tell(state, pop, ev.fitness)
            base = self.strategy.served_base(state)
            if base is not None and math.isfinite(stats.mean_norm):
                refresh = time.perf_counter()
                self.engine.update_base_weights(base)
                timings["base_update_s"] = time.perf_counter() - refresh
        check_finite_mean(stats.mean_norm, generation, self.strategy)
        checked = time.perf_counter()
        self.comm.check_same(state.mean, f"the ES mean after generation {generation}")
        comm_s = ev.comm_s + time.perf_counter() - checked
        es_s = (sampled - start) + (checked - told)
        record = GenerationRecord(
            generation=generation,
            es=stats,
            scores=ev.metrics,
            **mean_fields(ev, mean_ev),
            task_stats=self.task.after_generation(ev.metrics),
            generate_s=ev.generate_s,
            score_s=ev.score_s,
            es_s=es_s,
            generation_s=time.perf_counter() - start,
            engine_timings=timings,  # full mode: + base_update_s (in es_s too)
            comm_s=comm_s if self.comm.world_size > 1 else None,
            diagnostics=generation_diagnostics(ev, pop),
            weight_change=self.weight_change(before, state, stats),
        )
        return state, record

    def run(self, state: ESState, ctx: RunContext) -> tuple[ESState, Record]:
        """Run from ``state.generation`` to ``self.generations``; returns the final state and
        the summary (the last eval). A resumed run (``state.generation > 0``, records so far in
        ``ctx.history``) does not evaluate the start again."""
        for cb in self.callbacks:
            cb.on_run_start(ctx, state)
        try:
            state, summary = self._generations(state, ctx)
            for cb in self.callbacks:
                cb.on_run_end(ctx, summary, state)
        except BaseException as error:
            for cb in self.callbacks:
                cb.on_run_error(ctx, error)
            raise
        return state, summary

    def _generations(self, state: ESState, ctx: RunContext) -> tuple[ESState, Record]:
        last_eval = latest_eval(ctx.history)
        spent = sum(r.get(M.GENERATION_S) or 0.0 for r in ctx.history)  # a resumed run's
        clock = TrainClock(self.time_budget_s, self.eval_every_s, spent)
        if state.generation == 0:
            if self.eval_start:
                self.check_generation_fits()
                last_eval = self._evaluate(ctx, state)
            data = {M.data_stat(k): v for k, v in self.task.data_stats().items()}
            self._emit(ctx, GenerationRecord(generation=0, eval=last_eval, data=data), state)
        while state.generation < self.generations and not clock.out_of_time():
            state, record = self.step(state)
            marked = clock.tick(record.generation_s)
            g = state.generation
            due = self._due(g, marked, clock)
            if due or g == self.generations or clock.out_of_time():
                last_eval = self._evaluate(ctx, state)
                record = replace(record, eval=last_eval)
            self._emit(ctx, replace(record, train_s=clock.train_s), state)
        return state, {M.GENERATION: state.generation, **last_eval}

    def check_generation_fits(self) -> None:
        """Before the start eval: the engine must hold a generation's call (every member, and
        the mean with ``train_mean``, on generation 1's prompts; this rank's share of the rows).
        The eval's call has fewer rows, so a memory cap that cannot hold a generation's (a fixed
        ``server.max_batch_rows`` too large for the memory left) would otherwise stop the run
        at generation 1, after the eval (:meth:`Engine.check_rows`)."""
        examples = self.task.train_examples(1)
        members = self.strategy.population_size + (1 if self.train_mean else 0)
        mine = self.comm.shard([(m, p) for m in range(members) for p in range(len(examples))])
        used = sorted({p for _, p in mine})  # the prompts this rank's rows pad among
        prompts = [render(self.engine, examples[p]) for p in used]
        self.engine.check_rows(prompts, len(mine), self.task.sampling)

    def _due(self, generation: int, marked: bool, clock: TrainClock) -> bool:
        """Whether the mean is evaluated after ``generation`` (besides the last); a timed run's
        clock is rank 0's, so every rank of a process group decides alike."""
        if not clock.timed:
            return generation % self.eval_every == 0
        if self.comm.world_size > 1:
            clock.train_s, clock.next_mark, marked = self.comm.broadcast(
                (clock.train_s, clock.next_mark, marked)
            )
        return marked if self.eval_every_s is not None else generation % self.eval_every == 0

    def _evaluate(self, ctx: RunContext, state: ESState) -> Record:
        """Evaluate the mean; its samples go to the callbacks' ``on_eval``."""
        record, samples = self.evaluate_mean(state)
        for cb in self.callbacks:
            cb.on_eval(ctx, state.generation, samples)
        return record

    def _emit(self, ctx: RunContext, record: GenerationRecord, state: ESState) -> None:
        """A generation's end, whole: a stop that comes while the callbacks take it is raised
        after the last (a SIGTERM between the results writer and the checkpointer left
        generation 1 in results.jsonl but in no checkpoint; the resume lost it)."""
        with deferred():
            for cb in self.callbacks:
                cb.on_generation_end(ctx, record, state)
