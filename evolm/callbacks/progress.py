"""A progress bar over generations (or, off a terminal, one log line per generation)."""

from __future__ import annotations

import logging

from tqdm.auto import tqdm

from evolm import metrics as M
from evolm.callbacks.base import Callback, RunContext
from evolm.callbacks.record import GenerationRecord, Record
from evolm.es import ESState

log = logging.getLogger(__name__)


class ProgressBar(Callback):
    """A tqdm bar over generations showing fitness, the mean's reward on the same training
    rows (``train_mean=true``) and the latest eval reward.

    Where the bar is not drawn (its stream, stderr, is not a terminal: output redirected to a
    file or a pipe, or ``disable``), it logs one concise line every ``log_every`` generations
    instead (and the first and last): generation, fitness mean and std, the mean's training
    reward, eval reward, seconds.
    """

    def __init__(self, disable: bool | None = None, log_every: int = 1) -> None:
        self.disable = disable
        self.log_every = max(1, log_every)
        self.bar: tqdm | None = None
        self.postfix: dict[str, str] = {}

    def on_run_start(self, ctx: RunContext, state: ESState) -> None:
        self.bar = tqdm(
            total=ctx.generations,
            initial=state.generation,
            desc="ES",
            unit="gen",
            disable=self.disable,
            dynamic_ncols=True,
        )
        self.postfix = {}
        for record in ctx.history:  # a resumed run shows where it stopped
            self._note(record)
        self.bar.set_postfix(self.postfix)

    def _note(self, record: Record) -> None:
        if M.FITNESS_MEAN in record:
            self.postfix["fitness"] = f"{record[M.FITNESS_MEAN]:.4g}"
            self.postfix["max"] = f"{record[M.FITNESS_MAX]:.4g}"
        if M.TRAIN_MEAN_REWARD in record:
            self.postfix["mean"] = f"{record[M.TRAIN_MEAN_REWARD]:.4g}"
        if M.EVAL_REWARD in record:
            self.postfix["eval"] = f"{record[M.EVAL_REWARD]:.4g}"

    def on_generation_end(self, ctx: RunContext, record: GenerationRecord, state: ESState) -> None:
        if self.bar is None:
            return
        self._note(record.as_record())
        if record.es is not None:
            self.bar.update(1)
        self.bar.set_postfix(self.postfix)
        g = record.generation
        if self.bar.disable and (g % self.log_every == 0 or g in (1, ctx.generations)):
            log.info("%s", progress_line(record, ctx.generations))

    def on_run_end(self, ctx: RunContext, summary: Record, state: ESState) -> None:
        if self.bar is not None:
            self.bar.close()

    def on_run_error(self, ctx: RunContext, error: BaseException) -> None:
        if self.bar is not None:
            self.bar.close()


def progress_line(record: GenerationRecord, generations: int) -> str:
    """``generation 3/40: fitness 0.1234 (std 0.0456), mean 0.1502, eval reward 0.2100, 1.3 s
    (engine tail 0.4 s)``: ``mean`` the unperturbed mean's reward on the same training rows
    (``train/mean/reward``, where ``train_mean=true``), the tail (``time/engine_tail_s``) where
    the local engine reports it."""
    parts = []
    if record.es is not None:
        parts.append(f"fitness {record.es.fitness_mean:.4g} (std {record.es.fitness_std:.4g})")
    if record.mean_reward is not None:
        parts.append(f"mean {record.mean_reward:.4g}")
    if record.eval_reward is not None:
        parts.append(f"eval reward {record.eval_reward:.4g}")
    seconds = record.generation_s + record.eval.get(M.EVAL_S, 0.0)
    tail = record.engine_timings.get("tail_s")
    parts.append(f"{seconds:.1f} s" + ("" if tail is None else f" (engine tail {tail:.1f} s)"))
    return f"generation {record.generation}/{generations}: {', '.join(parts)}"
