"""The final mean adapter, in PEFT format."""

from __future__ import annotations

import logging
from pathlib import Path

from evolm.callbacks.base import Callback, RunContext
from evolm.callbacks.record import Record
from evolm.es import ESState
from evolm.lora import save_adapter

log = logging.getLogger(__name__)


class AdapterWriter(Callback):
    """Writes the final mean adapter to ``<run dir>/<dirname>`` in PEFT format (atomically) at
    the end of the run. The composition root adds it before every configured callback, so it is
    written with any ``callbacks``/``logger`` choice and exists when a logger uploads it."""

    def __init__(self, dirname: str = "adapter") -> None:
        self.dirname = dirname

    def on_run_end(self, ctx: RunContext, summary: Record, state: ESState) -> None:
        path = Path(ctx.output_dir) / self.dirname
        save_adapter(path, ctx.layout, state.mean, base_model=ctx.base_model)
        log.info("final adapter: %s", path)
