"""Checkpoints as the run goes (the format and resume: :mod:`evolm.checkpoint`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from evolm.callbacks.base import Callback, RunContext
from evolm.callbacks.record import GenerationRecord, Record
from evolm.checkpoint import CHECKPOINT_DIR, checkpoints, prune, run_identity, save_checkpoint
from evolm.errors import ConfigError, RunAborted
from evolm.es import ESState
from evolm.interrupt import interruption

log = logging.getLogger(__name__)


class Checkpointer(Callback):
    """Saves a checkpoint every ``every`` generations and at the last one (the one a time
    budget stopped at too), keeping the newest ``keep``, in ``<run dir>/checkpoints/``. Resume
    with ``python -m evolm resume=<run dir>``.

    A run stopped by SIGINT or SIGTERM (:mod:`evolm.interrupt`) also saves its last finished
    generation, so its resume loses no finished work; with ``es.mean=full`` a stop that comes
    while a generation's update is folded into the mean in place keeps the last periodic
    checkpoint instead (that state is half-updated: it is never saved)."""

    def __init__(self, every: int = 10, keep: int = 2) -> None:
        if every < 1:
            raise ConfigError("every", f"must be >= 1, got {every}", "e.g. every=10")
        if keep < 1:
            raise ConfigError("keep", f"must be >= 1, got {keep}", "e.g. keep=2")
        self.every = every
        self.keep = keep
        self.records: list[Record] = []
        # the newest finished generation not yet saved: its state, the task and callback state
        # and how many records it has
        self.unsaved: tuple[ESState, dict[str, dict[str, Any]], int] | None = None

    def on_run_start(self, ctx: RunContext, state: ESState) -> None:
        self.records, self.unsaved = list(ctx.history), None

    def on_generation_end(self, ctx: RunContext, record: GenerationRecord, state: ESState) -> None:
        self.records.append(record.as_record())
        g = state.generation
        if g == 0:
            return
        extra = {name: obj.state_dict() for name, obj in ctx.stateful.items()}
        self.unsaved = (state, extra, len(self.records))
        if g % self.every == 0 or g == ctx.generations:
            self.save(ctx, state, extra, len(self.records))

    def on_run_end(self, ctx: RunContext, summary: Record, state: ESState) -> None:
        """A run that ended before its last generation (``time_budget_s``) saves the generation
        it stopped at: ``resume=<run dir> time_budget_s=...`` continues it from there."""
        if self.unsaved is None or self.unsaved[0].consumed:
            return
        stopped = self.unsaved[0].generation
        path = self.save(ctx, *self.unsaved)
        log.info("saved generation %d, where the run stopped (%s)", stopped, path)

    def on_run_error(self, ctx: RunContext, error: BaseException) -> None:
        stop = interruption(error)
        if stop is None or self.unsaved is None:
            return
        state, extra, count = self.unsaved
        if state.consumed:  # es.mean=full updated its mean in place since: not that generation's
            log.warning(
                "%s: generation %d's mean was already being updated in place (es.mean=full); "
                "the last checkpoint is kept",
                stop.name,
                state.generation,
            )
            return
        try:
            path = self.save(ctx, state, extra, count)
        except RunAborted as e:  # the disk is full: the interruption stays the error
            log.error("%s", e)
            return
        log.info("%s: saved generation %d (%s)", stop.name, state.generation, path)

    def save(
        self, ctx: RunContext, state: ESState, extra: dict[str, dict[str, Any]], count: int
    ) -> Path:
        """Checkpoint ``state`` with ``extra`` and the first ``count`` records."""
        g = state.generation
        directory = Path(ctx.output_dir) / CHECKPOINT_DIR
        try:
            run = run_identity(ctx.config)
            path = save_checkpoint(
                directory, state, self.records[:count], extra, run, ctx.data, ctx.data_changes
            )
        except OSError as e:  # e.g. ENOSPC: the partial files are removed
            found = checkpoints(directory)
            last = f"the last good one, {found[-1][1]}, is kept" if found else "none exists"
            raise RunAborted(
                f"could not write the checkpoint of generation {g} in {directory} ({e}); "
                f"its partial file was removed and {last}. Fix: free disk space, then "
                f"python -m evolm resume={ctx.output_dir}"
            ) from e
        self.unsaved = None
        prune(directory, self.keep)
        log.debug("checkpoint %s", path)
        return path
