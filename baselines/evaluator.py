"""Evaluate a baseline's adapter exactly as evolm evaluates the ES mean.

:func:`evolm.loop.eval_metrics` on evolm's in-process engine (``server=local``, the ES run's
settings): the same held-out puzzles, greedy decoding, stop strings and token budget, the same
``eval/*`` names (the task's scores, the completions' diagnostics, the shortcut figures, the KL
to the base, extra evals). Without an engine of its own the run loads one for each evaluation
and releases it after, so the training process holds no second copy of the model between
evaluations; a run that keeps one (``grpo.generation=evolm``: its rollouts' engine) passes it,
and the evaluation releases only what it sized (KV slots, adapter buffers), not the model.
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
from evolm.engine.base import Engine
from evolm.loop import all_eval_samples, eval_metrics
from evolm.lora import LoraPopulation

log = logging.getLogger(__name__)


def evaluate_adapter(
    parts: SharedParts, tensors: Sequence[torch.Tensor], seed: int, engine: Engine | None = None
) -> tuple[Record, list[Sample]]:
    """The ``eval/*`` metrics of the adapter ``tensors`` (``parts.layout``'s order, fp32) with
    ``time/eval_s`` (the engine's load included when it is loaded here), and every eval prompt
    with its completion and scores (what the ES run's ``samples/`` holds). ``engine``: the
    run's persistent engine (None: one loaded for this evaluation alone)."""
    start = time.perf_counter()
    owned = engine is None
    engine = parts.make_engine() if engine is None else engine
    try:
        adapter = LoraPopulation.single(parts.layout, [t.detach().float() for t in tensors])
        metrics, ev, extras = eval_metrics(
            engine, parts.task, adapter, seed, extra_evals=parts.extra_evals
        )
        samples = all_eval_samples(engine, parts.task, ev, parts.extra_evals, extras)
    finally:
        engine.close()  # its KV slots and adapter buffers: the training step needs the memory
        if owned:
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
