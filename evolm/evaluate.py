"""Evaluate a population on a task: the one place that knows both an engine and a task."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from evolm import metrics as M
from evolm.diagnostics import RowStats, completion_stats, summarize
from evolm.dist import SINGLE, Comm
from evolm.engine.base import Engine, TextRequest
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
    sampling = sampling or task.sampling
    if comm.world_size > 1:
        return _evaluate_sharded(engine, task, examples, adapters, seed, comm, sampling)
    start = time.perf_counter()
    completions = engine.generate([render(engine, e) for e in examples], adapters, sampling, seed)
    generated = time.perf_counter()
    flat = [c for member in completions for c in member]
    scores = task.score(list(examples) * len(completions), flat)
    stats = completion_stats(flat)
    return _evaluation(task, examples, scores, stats, completions, start, generated)


def _evaluation(
    task: Task,
    examples: Sequence[Example],
    scores: Scores,
    stats: RowStats,
    completions: list[list[str]],
    start: float,
    generated: float,
) -> Evaluation:
    """The :class:`Evaluation` of every member's rows (member-major, as ``scores``)."""
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
        generate_s=generated - start,
        score_s=time.perf_counter() - generated,
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
) -> Evaluation:
    """:func:`evaluate` over a process group: this rank's rows, then one all-gather."""
    start = time.perf_counter()
    members, n_prompts = (1 if adapters is None else len(adapters)), len(examples)
    rows = [(m, p) for m in range(members) for p in range(n_prompts)]
    mine = comm.shard(rows)
    prompts = [render(engine, e) for e in examples]
    request = TextRequest(prompts, adapters, mine, sampling, seed)
    texts = engine.generate_rows(request) if mine else []
    generated = time.perf_counter()
    if task.row_scores:  # each rank scores its rows; one all-gather of scores and stats
        local: Scores = task.score([examples[p] for _, p in mine], texts) if mine else {}
        sent = time.perf_counter()
        parts = comm.gather((local, completion_stats(texts)))
        comm_s = time.perf_counter() - sent
        scores = _merge_scores([p for p, _ in parts], comm, type(task).__name__)
        stats = {k: comm.unshard([s[k] for _, s in parts]) for k in parts[0][1]}
    else:  # the whole population scored at once, as one process does
        sent = time.perf_counter()
        every = comm.unshard(comm.gather(texts))
        comm_s = time.perf_counter() - sent
        whole = task.score([examples[p] for _, p in rows], every) if comm.is_main else {}
        sent = time.perf_counter()
        scores = comm.broadcast(whole)
        comm_s += time.perf_counter() - sent
        stats = completion_stats(every)
    completions = [[""] * n_prompts for _ in range(members)]
    for (m, p), text in zip(mine, texts, strict=True):
        completions[m][p] = text
    ev = _evaluation(task, examples, scores, stats, completions, start, generated)
    return replace(ev, comm_s=comm_s)


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
