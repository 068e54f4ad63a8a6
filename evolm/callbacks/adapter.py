"""The final mean adapter, in PEFT format (and, with ``keep_best``, the best evaluation's)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from evolm.callbacks.base import RunContext
from evolm.callbacks.writer import MeanWriter
from evolm.es import ESState
from evolm.lora import save_adapter


class AdapterWriter(MeanWriter):
    """Writes the final mean adapter to ``<run dir>/<dirname>`` in PEFT format (atomically) at
    the end of the run, and with ``best`` the best evaluation's to ``<dirname>-best``
    (:class:`~evolm.callbacks.writer.MeanWriter`). The composition root adds it before every
    configured callback, so it is written with any ``callbacks``/``logger`` choice and exists
    when a logger uploads it."""

    what = "adapter"

    def __init__(self, dirname: str = "adapter", best: str | None = None) -> None:
        super().__init__(dirname, best)

    def save(self, path: Path, ctx: RunContext, state: ESState, extra: Mapping[str, str]) -> None:
        save_adapter(path, ctx.layout, state.mean, base_model=ctx.base_model, extra=extra)
