"""``es.mean=full``: the final mean as a plain transformers model directory."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from evolm.callbacks.base import Callback, RunContext
from evolm.callbacks.record import Record
from evolm.es import ESState
from evolm.model.full import save_model

log = logging.getLogger(__name__)


class ModelWriter(Callback):
    """``es.mean=full``: writes the final mean as a plain transformers model directory
    (config, tokenizer, safetensors; the base's dtype) to ``<run dir>/<dirname>``, atomically,
    at the end of the run: it loads anywhere with no merge step (:mod:`evolm.model.full`)."""

    def __init__(self, base_dir: str, names: Sequence[str], dirname: str = "model") -> None:
        self.base_dir, self.names, self.dirname = base_dir, list(names), dirname

    def on_run_end(self, ctx: RunContext, summary: Record, state: ESState) -> None:
        path = Path(ctx.output_dir) / self.dirname
        save_model(path, self.base_dir, dict(zip(self.names, state.mean, strict=True)))
        log.info("final model: %s", path)
