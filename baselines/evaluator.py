"""Evaluate a baseline's adapter exactly as evolm evaluates the ES mean.

:func:`evolm.loop.eval_metrics` on a fresh in-process engine (``server=local``, the ES run's
settings): the same held-out puzzles, greedy decoding, stop strings and token budget, the same
``eval/*`` names (the task's scores, the completions' diagnostics, the shortcut figures, the KL
to the base, extra evals). The engine is loaded for each evaluation and released after it, so
the training process holds no second copy of the model between evaluations.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Sequence

import torch

from baselines.runconfig import SharedParts
from evolm import metrics as M
from evolm.callbacks import Record
from evolm.callbacks.base import Sample
from evolm.loop import eval_metrics, eval_samples
from evolm.lora import LoraPopulation

log = logging.getLogger(__name__)


def evaluate_adapter(
    parts: SharedParts, tensors: Sequence[torch.Tensor], seed: int
) -> tuple[Record, list[Sample]]:
    """The ``eval/*`` metrics of the adapter ``tensors`` (``parts.layout``'s order, fp32) with
    ``time/eval_s`` (the engine's load included), and every eval prompt with its completion and
    scores (what the ES run's ``samples/`` holds)."""
    start = time.perf_counter()
    engine = parts.make_engine()
    try:
        adapter = LoraPopulation.single(parts.layout, [t.detach().float() for t in tensors])
        metrics, ev = eval_metrics(engine, parts.task, adapter, seed, extra_evals=parts.extra_evals)
        samples = eval_samples(engine, parts.task, ev, range(len(parts.task.eval_examples())))
    finally:
        engine.close()
        del engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    seconds = time.perf_counter() - start
    log.info(
        "eval: reward %.4f, accuracy %s (%.1fs)",
        metrics[M.EVAL_REWARD],
        metrics.get(M.eval_score(M.CORRECT_SCORE), "n/a"),
        seconds,
    )
    return {**metrics, M.EVAL_S: seconds}, samples
