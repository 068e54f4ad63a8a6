"""The mean written in the run's format: at the end, and at its best evaluation (``keep_best``).

:class:`MeanWriter` is the base of the final mean's writers (:class:`~evolm.callbacks.adapter.
AdapterWriter`, :class:`~evolm.callbacks.model.ModelWriter`): a subclass says how a mean is
saved; this class says when. With ``best`` (the root key ``keep_best``: a metric of the mean's
evaluation, higher is better, e.g. ``eval/accuracy_mean``), every evaluation whose value beats
all earlier ones writes the mean to ``<run dir>/<dirname>-best`` as well, atomically, with
``best.json`` (``generation``, ``metric``, ``value``) inside: an ES run whose mean peaks and
then drifts (a fixed step size keeps moving it) keeps its best adapter. A resumed run goes on
from the best of its records; a kept mean its records do not hold (a resume on new data from a
checkpoint older than it) is removed, with a warning. At the end, a run whose last evaluation
is below its best says so (a warning naming both generations and the kept mean): its final
mean is not its best one (issue 36's z5s1 ended at 15.15% after a start of 16.9%).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from collections.abc import Mapping
from pathlib import Path

from evolm.callbacks.base import Callback, RunContext
from evolm.callbacks.record import GenerationRecord, Record
from evolm.es import ESState

log = logging.getLogger(__name__)

BEST_FILE = "best.json"


class MeanWriter(Callback):
    """Writes the mean to ``<run dir>/<dirname>`` at the end of the run and, with ``best``, to
    ``<run dir>/<dirname>-best`` at each new best evaluation (see the module docstring)."""

    what = "mean"

    def __init__(self, dirname: str, best: str | None = None) -> None:
        self.dirname, self.best = dirname, best
        self._best_value: float | None = None
        self._best_generation: int | None = None
        self._last: tuple[int, float | None] | None = None  # the last eval: generation, value
        self._warned = False

    def save(self, path: Path, ctx: RunContext, state: ESState, extra: Mapping[str, str]) -> None:
        """Write ``state``'s mean to ``path`` (atomically), with the text files ``extra``."""
        raise NotImplementedError

    def on_run_start(self, ctx: RunContext, state: ESState) -> None:
        if self.best is not None:
            for r in ctx.history:
                if self.best in r:
                    self._note(int(r.get("generation", 0)), r[self.best])
            self._drop_stale(Path(ctx.output_dir) / f"{self.dirname}-best", ctx.history)

    def _drop_stale(self, path: Path, history: list[Record]) -> None:
        """Remove a kept mean that the records this run goes on from do not hold (a resume on new
        data replays generations after its checkpoint differently; a reused run directory):
        the next evaluation then keeps its mean, whatever the records' best was."""
        try:
            note = json.loads((path / BEST_FILE).read_text())
        except (OSError, ValueError):
            return
        if any(
            r.get("generation") == note.get("generation")
            and _finite(r.get(str(note.get("metric")))) == note.get("value")
            for r in history
        ):
            return
        shutil.rmtree(path)
        self._best_value = self._best_generation = None
        log.warning(
            "%s held generation %s's mean (%s %s), which is not among the records this run "
            "goes on from (a resume on new data or a reused run directory): removed; the next "
            "evaluation keeps its mean there",
            path,
            note.get("generation"),
            note.get("metric"),
            note.get("value"),
        )

    def on_generation_end(self, ctx: RunContext, record: GenerationRecord, state: ESState) -> None:
        if self.best is None or not record.eval:
            return
        if self.best not in record.eval:
            if not self._warned:
                log.warning(
                    "keep_best=%s is not among this run's eval metrics, so no best mean is "
                    "kept; name one of: %s",
                    self.best,
                    ", ".join(sorted(k for k in record.eval if k.startswith("eval/"))),
                )
                self._warned = True
            return
        if not self._note(record.generation, record.eval[self.best]):
            return
        value = self._best_value
        path = Path(ctx.output_dir) / f"{self.dirname}-best"
        note = {"generation": record.generation, "metric": self.best, "value": value}
        self.save(path, ctx, state, {BEST_FILE: json.dumps(note, indent=2)})
        generation = record.generation
        log.info("best %s so far, %.6g at generation %d: %s", self.best, value, generation, path)

    def _note(self, generation: int, value: object) -> bool:
        """Record an evaluation's ``best`` metric; True when it beats every earlier one (the
        first of a tie; never a NaN)."""
        finite = _finite(value)
        self._last = (generation, finite)
        if finite is None or (self._best_value is not None and finite <= self._best_value):
            return False
        self._best_value, self._best_generation = finite, generation
        return True

    def on_run_end(self, ctx: RunContext, summary: Record, state: ESState) -> None:
        path = Path(ctx.output_dir) / self.dirname
        self.save(path, ctx, state, {})
        log.info("final %s: %s", self.what, path)
        last, best = self._last, self._best_value
        if last is None or last[1] is None or best is None or last[1] >= best:
            return
        start = " (the start: no generation of ES beat it)" if self._best_generation == 0 else ""
        log.warning(
            "the last evaluation, %s %.6g at generation %d, is below this run's best, %.6g at "
            "generation %d%s: the final %s in %s is not the best one, which is kept in %s-best",
            self.best, last[1], last[0], best, self._best_generation, start, self.what, path, path,
        )  # fmt: skip


def _finite(value: object) -> float | None:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None
