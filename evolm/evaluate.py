"""Evaluate a population on a task: the one place that knows both an engine and a task."""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from evolm import metrics as M
from evolm.diagnostics import RowStats, completion_stats, summarize
from evolm.dist import SINGLE, Comm
from evolm.engine.base import Engine, Row, TextRequest
from evolm.lora.layout import LoraPopulation
from evolm.sampling import Sampling
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
    diagnostics: dict[str, float] = field(default_factory=dict)  # evolm.diagnostics + the task's
    scores: Scores = field(default_factory=dict)  # per completion, member-major; no "_" keys


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
    sampling: Sampling | None = None,
) -> Evaluation:
    """Generate every member's completions in one engine call and score them in one batch
    (decoded with ``sampling``; ``None``: the task's).

    In a process group (``comm``), each rank generates its shard of the (member, prompt) rows
    (:meth:`Comm.shard`: interleaved) and every rank ends with every row's scores (one
    all-gather), so every rank returns the same :class:`Evaluation` as one process would;
    ``completions`` then holds only this rank's rows (others are empty strings).
    """
    members = 1 if adapters is None else len(adapters)
    [ev] = _evaluate_parts(engine, task, examples, adapters, seed, comm, sampling, (members,))
    return ev


def evaluate_with_extra(
    engine: Engine,
    task: Task,
    examples: Sequence[Example],
    adapters: LoraPopulation,
    extra: LoraPopulation,
    seed: int,
    comm: Comm = SINGLE,
    sampling: Sampling | None = None,
) -> tuple[Evaluation, Evaluation]:
    """``adapters``' :class:`Evaluation` and ``extra``'s (e.g. the ES mean beside its members)
    from ONE engine call over ``adapters`` then ``extra`` (member-major rows: ``adapters``' rows
    first, in :func:`evaluate`'s order and on the same ranks), split apart before anything is
    scored or summed: each part is scored by its own ``task.score`` call (a task whose scores
    compare rows, ``row_scores=False``, sees exactly the rows it sees in :func:`evaluate`) and
    summarized alone. The first is :func:`evaluate`'s of ``adapters`` wherever the engine's
    completions of those rows do not depend on the other rows in its batch. Both carry the
    whole call's timings (``generate_s``, ``score_s``, ``comm_s``: what the call cost)."""
    both = adapters.extended(extra)
    parts = (len(adapters), len(extra))
    members, extras = _evaluate_parts(engine, task, examples, both, seed, comm, sampling, parts)
    return members, extras


def _evaluate_parts(
    engine: Engine,
    task: Task,
    examples: Sequence[Example],
    adapters: LoraPopulation | None,
    seed: int,
    comm: Comm,
    sampling: Sampling | None,
    parts: Sequence[int],
) -> list[Evaluation]:
    """One engine call over every member's rows, one :class:`Evaluation` per part (``parts``:
    consecutive member counts summing to the population's size)."""
    sampling = sampling or task.sampling
    if comm.world_size > 1:
        return _evaluate_sharded(engine, task, examples, adapters, seed, comm, sampling, parts)
    start = time.perf_counter()
    completions = engine.generate([render(engine, e) for e in examples], adapters, sampling, seed)
    generated = time.perf_counter()
    flat = [c for member in completions for c in member]
    rows = [(m, p) for m in range(len(completions)) for p in range(len(examples))]
    scores = _score_parts(task, examples, rows, flat, parts)
    stats = completion_stats(flat)
    return _split(task, examples, scores, stats, completions, parts, start, generated)


def _bounds(parts: Sequence[int]) -> list[tuple[int, int]]:
    """Each part's members as ``[first, end)``: ``(2, 1)`` -> ``[(0, 2), (2, 3)]``."""
    ends = list(itertools.accumulate(parts))
    return list(zip([0, *ends[:-1]], ends, strict=True))


def _score_parts(
    task: Task,
    examples: Sequence[Example],
    rows: Sequence[Row],
    texts: Sequence[str],
    parts: Sequence[int],
) -> Scores:
    """``task.score`` of the completions ``texts`` of ``rows`` (member-major), one call per
    part that has rows, the parts' scores joined in row order."""
    out: Scores = {}
    for first, end in _bounds(parts):
        mine = [i for i, (m, _) in enumerate(rows) if first <= m < end]
        if not mine:
            continue
        got = task.score([examples[rows[i][1]] for i in mine], [texts[i] for i in mine])
        if out and set(got) != set(out):
            name = type(task).__name__
            raise KeyError(f"{name}.score returned keys {sorted(got)}, then {sorted(out)}")
        for key, values in got.items():
            out.setdefault(key, []).extend(values)
    return out


def _split(
    task: Task,
    examples: Sequence[Example],
    scores: Scores,
    stats: RowStats,
    completions: list[list[str]],
    parts: Sequence[int],
    start: float,
    generated: float,
) -> list[Evaluation]:
    """The :class:`Evaluation` of each part of the population's rows (member-major, as
    ``scores`` and ``stats``), each summarized from its own rows alone."""
    n = len(examples)
    out = []
    for first, end in _bounds(parts):
        cut = slice(first * n, end * n)
        part_scores = {k: v[cut] for k, v in scores.items()}
        part_stats = {k: v[cut] for k, v in stats.items()}
        out.append(_evaluation(task, examples, part_scores, part_stats, completions[first:end]))
    score_s = time.perf_counter() - generated
    return [replace(ev, generate_s=generated - start, score_s=score_s) for ev in out]


def _evaluation(
    task: Task,
    examples: Sequence[Example],
    scores: Scores,
    stats: RowStats,
    completions: list[list[str]],
) -> Evaluation:
    """The :class:`Evaluation` of every member's rows (member-major, as ``scores``); its
    timings are the caller's to set."""
    if "reward" not in scores:
        raise KeyError(f"{type(task).__name__}.score must return a 'reward' list")
    members, n_prompts = len(completions), len(examples)
    public = {k: v for k, v in scores.items() if not M.is_private_score(k)}
    table = {
        k: torch.tensor(v, dtype=torch.float64).view(members, n_prompts) for k, v in public.items()
    }
    diagnostics = summarize(stats, public, members, n_prompts)
    diagnostics |= task_summary(task, list(examples) * members, scores, diagnostics)
    return Evaluation(
        fitness=table["reward"].mean(dim=1),
        metrics={k: v.mean().item() for k, v in table.items()},
        completions=completions,
        generate_s=0.0,
        score_s=0.0,
        diagnostics=diagnostics,
        scores=public,
    )


def task_summary(
    task: Task, rows: Sequence[Example], scores: Scores, diagnostics: Mapping[str, float]
) -> dict[str, float]:
    """The task's set-level numbers (:meth:`Task.summarize`) of these rows; a name that a
    diagnostic already has is an error, not a silent overwrite."""
    out = task.summarize(rows, scores)
    clash = sorted(set(out) & set(diagnostics))
    if clash:
        raise KeyError(f"{type(task).__name__}.summarize returned diagnostic names {clash}")
    return out


def _evaluate_sharded(
    engine: Engine,
    task: Task,
    examples: Sequence[Example],
    adapters: LoraPopulation | None,
    seed: int,
    comm: Comm,
    sampling: Sampling,
    parts: Sequence[int],
) -> list[Evaluation]:
    """:func:`_evaluate_parts` over a process group: this rank's rows, then one all-gather."""
    start = time.perf_counter()
    members, n_prompts = (1 if adapters is None else len(adapters)), len(examples)
    rows = [(m, p) for m in range(members) for p in range(n_prompts)]
    mine = comm.shard(rows)
    prompts = [render(engine, e) for e in examples]
    request = TextRequest(prompts, adapters, mine, sampling, seed)
    texts = engine.generate_rows(request) if mine else []
    generated = time.perf_counter()
    if task.row_scores:  # each rank scores its rows; one all-gather of scores and stats
        local = _score_parts(task, examples, mine, texts, parts)
        sent = time.perf_counter()
        gathered = comm.gather((local, completion_stats(texts)))
        comm_s = time.perf_counter() - sent
        scores = _merge_scores([p for p, _ in gathered], comm, type(task).__name__)
        stats = {k: comm.unshard([s[k] for _, s in gathered]) for k in gathered[0][1]}
    else:  # the whole population scored at once (a part at a time), as one process does
        sent = time.perf_counter()
        every = comm.unshard(comm.gather(texts))
        comm_s = time.perf_counter() - sent
        whole = _score_parts(task, examples, rows, every, parts) if comm.is_main else {}
        sent = time.perf_counter()
        scores = comm.broadcast(whole)
        comm_s += time.perf_counter() - sent
        stats = completion_stats(every)
    completions = [[""] * n_prompts for _ in range(members)]
    for (m, p), text in zip(mine, texts, strict=True):
        completions[m][p] = text
    evs = _split(task, examples, scores, stats, completions, parts, start, generated)
    return [replace(ev, comm_s=comm_s) for ev in evs]


def kl_to_base(
    engine: Engine,
    examples: Sequence[Example],
    completions: Sequence[str],
    adapter: LoraPopulation,
    comm: Comm = SINGLE,
) -> dict[str, float]:
    """``{kl_mean, kl_std}``: the mean and std over every scored token of the per-token
    KL(adapted || base) along one member's ``completions`` of ``examples``
    (:meth:`Engine.kl_to_base`); empty where the engine cannot score. In a process group each
    rank scores the prompts it generated (:meth:`Comm.shard`) and one all-gather joins them."""
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


def _merge_scores(parts: Sequence[Scores], comm: Comm, task_name: str) -> Scores:
    """The per-rank score dicts (rank ``r``: rows ``r, r + world, ...``) as one, in row order."""
    keys = {tuple(sorted(p)) for p in parts if p}
    if len(keys) != 1:
        raise KeyError(f"{task_name}.score returned different keys on different ranks: {keys}")
    names = next(iter(keys))
    return {k: comm.unshard([p.get(k, []) for p in parts]) for k in names}
