"""Evaluate a population on a task: the one place that knows both an engine and a task.

Given each prompt's expected completion length (``expected``, from the prompt's last visit:
:class:`evolm.worklog.WorkLog`) and greedy decoding, the rows are scheduled by expected work:
one process hands its engine the rows longest-expected first (the scheduler starts the long
rows first, so a generation does not end on a few long rows running alone); a process group
splits the rows with :func:`evolm.dist.balanced` (equal expected work per rank, each rank's
longest first). Greedy tokens do not depend on the order or batch a row runs in, so this
changes timings only, never a completion; with sampling (``temperature > 0``) a row's random
draws depend on its position, so the rows keep today's order and sharding. So do engines that
group rows by member set (:attr:`~evolm.engine.base.Engine.batches_any_rows` False: servers),
where a balanced shard would take several calls instead of one to three.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from evolm import metrics as M
from evolm.diagnostics import RowStats, completion_stats, summarize
from evolm.dist import SINGLE, Assignment, Comm, balanced
from evolm.engine.base import Engine, Row, completion_info
from evolm.lora.layout import LoraPopulation
from evolm.task.base import Example, Scores, Task


@dataclass(frozen=True)
class Evaluation:
    """Per-member fitness (mean reward over prompts), mean task metrics, and timings."""

    fitness: torch.Tensor  # [M] float64
    metrics: dict[str, float]  # mean of every score key over all completions
    completions: list[list[str]]  # [M][P]
    generate_s: float
    score_s: float
    comm_s: float = 0.0  # a distributed evaluation's all-gather (and broadcast), in score_s
    diagnostics: dict[str, float] = field(default_factory=dict)  # evolm.diagnostics.summarize
    scores: Scores = field(default_factory=dict)  # per completion, member-major rows
    rows: list[Row] = field(default_factory=list)  # the (member, prompt) rows THIS process made
    lengths: list[float] = field(default_factory=list)  # per row, member-major; every rank's


PREFILL_COST = 1.0
"""A row's cost beyond its expected completion tokens, for :func:`evolm.dist.balanced`: its
prompt's prefill (one batched forward, about one decode step), so rows expected to be empty
still count and spread over the ranks."""


def row_lengths(completions: Sequence[str]) -> list[float]:
    """Each completion's length: its new tokens where the engine says
    (:class:`~evolm.engine.base.Completion`), else its characters."""
    out = []
    for text in completions:
        tokens, _ = completion_info(text)
        out.append(
            float(tokens) if tokens is not None and math.isfinite(tokens) else float(len(text))
        )
    return out


def row_costs(expected: Sequence[float], members: int) -> list[float]:
    """The expected work of each member-major row: its prompt's expected length plus
    :data:`PREFILL_COST`."""
    return [float(expected[p]) + PREFILL_COST for _ in range(members) for p in range(len(expected))]


def render(engine: Engine, example: Example) -> str:
    """The prompt text the model sees: raw text, or the chat template plus assistant prefix."""
    if isinstance(example.prompt, str):
        return example.prompt
    return engine.format_chat(example.prompt) + example.assistant_prefix


def evaluate(
    engine: Engine,
    task: Task,
    examples: Sequence[Example],
    adapters: LoraPopulation | None,
    seed: int,
    comm: Comm = SINGLE,
    expected: Sequence[float] | None = None,
) -> Evaluation:
    """Generate every member's completions in one engine call and score them in one batch.

    In a process group (``comm``), each rank generates its shard of the (member, prompt) rows
    (:meth:`Comm.shard`: interleaved) and every rank ends with every row's scores (one
    all-gather), so every rank returns the same :class:`Evaluation` as one process would;
    ``completions`` then holds only this rank's rows (others are empty strings; ``rows`` names
    this rank's).

    ``expected``: per prompt, its expected completion length (any unit, the same for every
    prompt). With greedy decoding and an engine that batches any rows
    (:attr:`Engine.batches_any_rows`) the rows are then scheduled by expected work (the module
    docstring); the result is the same.
    """
    members, n_prompts = (1 if adapters is None else len(adapters)), len(examples)
    if expected is not None and len(expected) != n_prompts:
        raise ValueError(f"{len(expected)} expected lengths for {n_prompts} prompts")
    scheduled = expected is not None and task.sampling.temperature == 0 and engine.batches_any_rows
    costs = row_costs(expected, members) if scheduled and expected is not None else None
    if comm.world_size > 1:
        assignment = None if costs is None else balanced(costs, comm.world_size)
        return _evaluate_sharded(engine, task, examples, adapters, seed, comm, assignment)
    start = time.perf_counter()
    prompts = [render(engine, e) for e in examples]
    rows = [(m, p) for m in range(members) for p in range(n_prompts)]
    if costs is None:
        completions = engine.generate(prompts, adapters, task.sampling, seed)
    else:  # longest expected first (stable): the long rows start first
        order = balanced(costs, 1)[0]
        texts = engine.generate_rows(
            prompts, adapters, [rows[i] for i in order], task.sampling, seed
        )
        by_row = SINGLE.unshard([texts], [order])
        completions = [by_row[m * n_prompts : (m + 1) * n_prompts] for m in range(members)]
    generated = time.perf_counter()
    flat = [c for member in completions for c in member]
    scores = task.score(list(examples) * len(completions), flat)
    stats = completion_stats(flat)
    ev = _evaluation(task, scores, stats, completions, n_prompts, start, generated)
    return replace(ev, rows=rows, lengths=row_lengths(flat))


def _evaluation(
    task: Task,
    scores: Scores,
    stats: RowStats,
    completions: list[list[str]],
    n_prompts: int,
    start: float,
    generated: float,
) -> Evaluation:
    if "reward" not in scores:
        raise KeyError(f"{type(task).__name__}.score must return a 'reward' list")
    table = {
        k: torch.tensor(v, dtype=torch.float64).view(len(completions), n_prompts)
        for k, v in scores.items()
    }
    return Evaluation(
        fitness=table["reward"].mean(dim=1),
        metrics={k: v.mean().item() for k, v in table.items()},
        completions=completions,
        generate_s=generated - start,
        score_s=time.perf_counter() - generated,
        diagnostics=summarize(stats, scores, len(completions), n_prompts),
        scores=scores,
    )


def _evaluate_sharded(
    engine: Engine,
    task: Task,
    examples: Sequence[Example],
    adapters: LoraPopulation | None,
    seed: int,
    comm: Comm,
    assignment: Assignment | None = None,
) -> Evaluation:
    """:func:`evaluate` over a process group: this rank's rows (interleaved, or the indices
    ``assignment`` gives it, in that order), then one all-gather."""
    start = time.perf_counter()
    members, n_prompts = (1 if adapters is None else len(adapters)), len(examples)
    rows = [(m, p) for m in range(members) for p in range(n_prompts)]
    mine = comm.shard(rows, assignment)
    prompts = [render(engine, e) for e in examples]
    texts = engine.generate_rows(prompts, adapters, mine, task.sampling, seed) if mine else []
    generated = time.perf_counter()
    if task.row_scores:  # each rank scores its rows; one all-gather of scores and stats
        local: Scores = task.score([examples[p] for _, p in mine], texts) if mine else {}
        sent = time.perf_counter()
        parts = comm.gather((local, completion_stats(texts), row_lengths(texts)))
        comm_s = time.perf_counter() - sent
        scores = _merge_scores([p[0] for p in parts], comm, type(task).__name__, assignment)
        stats = {k: comm.unshard([p[1][k] for p in parts], assignment) for k in parts[0][1]}
        lengths = comm.unshard([p[2] for p in parts], assignment)
    else:  # the whole population scored at once, as one process does
        sent = time.perf_counter()
        every = comm.unshard(comm.gather(texts), assignment)
        comm_s = time.perf_counter() - sent
        whole = task.score([examples[p] for _, p in rows], every) if comm.is_main else {}
        sent = time.perf_counter()
        scores = comm.broadcast(whole)
        comm_s += time.perf_counter() - sent
        stats = completion_stats(every)
        lengths = row_lengths(every)
    completions = [[""] * n_prompts for _ in range(members)]
    for (m, p), text in zip(mine, texts, strict=True):
        completions[m][p] = text
    ev = _evaluation(task, scores, stats, completions, n_prompts, start, generated)
    return replace(ev, comm_s=comm_s, rows=mine, lengths=lengths)


def kl_to_base(
    engine: Engine,
    examples: Sequence[Example],
    completions: Sequence[str],
    adapter: LoraPopulation,
    comm: Comm = SINGLE,
    mine: Sequence[int] | None = None,
) -> dict[str, float]:
    """``{kl_mean, kl_std}``: the mean and std over every scored token of the per-token
    KL(adapted || base) along one member's ``completions`` of ``examples``
    (:meth:`Engine.kl_to_base`); empty where the engine cannot score. In a process group each
    rank scores the prompts it generated (``mine``: the prompts of the evaluation's ``rows``;
    None: :meth:`Comm.shard`'s) and one all-gather joins them."""
    if mine is None:
        mine = comm.shard(range(len(examples))) if comm.world_size > 1 else range(len(examples))
    prompts = [render(engine, examples[p]) for p in mine]
    texts = [completions[p] for p in mine]
    values = engine.kl_to_base(prompts, texts, adapter) if prompts else []
    parts = comm.gather(values) if comm.world_size > 1 else [values]
    if any(part is None for part in parts):
        return {}
    tokens = torch.tensor([v for part in parts for row in part for v in row], dtype=torch.float64)
    if tokens.numel() == 0:
        return {}
    return {M.KL_MEAN: tokens.mean().item(), M.KL_STD: tokens.std(unbiased=False).item()}


def _merge_scores(
    parts: Sequence[Scores], comm: Comm, task_name: str, assignment: Assignment | None = None
) -> Scores:
    """The per-rank score dicts (rank ``r``: rows ``r, r + world, ...``, or its share of
    ``assignment``) as one, in row order."""
    keys = {tuple(sorted(p)) for p in parts if p}
    if len(keys) != 1:
        raise KeyError(f"{task_name}.score returned different keys on different ranks: {keys}")
    names = next(iter(keys))
    return {k: comm.unshard([p.get(k, []) for p in parts], assignment) for k in names}
