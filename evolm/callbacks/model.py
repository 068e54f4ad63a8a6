"""``es.mean=full``: the final mean as a plain transformers model directory."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from evolm.callbacks.base import RunContext
from evolm.callbacks.writer import MeanWriter
from evolm.es import ESState
from evolm.model.full import save_model


class ModelWriter(MeanWriter):
    """``es.mean=full``: writes the final mean as a plain transformers model directory
    (config, tokenizer, safetensors; the base's dtype) to ``<run dir>/<dirname>``, atomically,
    at the end of the run: it loads anywhere with no merge step (:mod:`evolm.model.full`). With
    ``best``, the best evaluation's too, to ``<dirname>-best`` (a whole model each time:
    :class:`~evolm.callbacks.writer.MeanWriter`)."""

    what = "model"

    def __init__(
        self, base_dir: str, names: Sequence[str], dirname: str = "model", best: str | None = None
    ) -> None:
        super().__init__(dirname, best)
        self.base_dir, self.names = base_dir, list(names)

    def save(self, path: Path, ctx: RunContext, state: ESState, extra: Mapping[str, str]) -> None:
        named = dict(zip(self.names, state.mean, strict=True))
        save_model(path, self.base_dir, named, extra=extra)
