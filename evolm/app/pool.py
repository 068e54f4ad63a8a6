"""One persistent engine per process: the trials of a multirun share it.

A Hydra multirun (the Optuna sweep) runs its trials one after another in ONE process. Loading
the model (``server=local``) or starting a server (``server=sglang|vllm``, 40-60 s) once per
trial would dominate a short trial, so :func:`open_engine` keeps the engine in a one-slot,
process-wide pool keyed by everything that defines it (the model path and the ``server`` node);
a trial with the same key gets the same engine back, re-pointed at its own LoRA layout (the
rank, alpha and targets may change between trials). A different key closes the old engine
first, so a sweep never holds two models or servers. :func:`release` closes the engine at the
end of a single run, and keeps it in a multirun; the pool closes it at process exit.

Remote servers fix ``--max-lora-rank`` (and SGLang its target modules) when they start: a
trial whose rank exceeds it fails with a ConfigError naming ``server.max_lora_rank``.
"""

from __future__ import annotations

import atexit
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from evolm.engine.base import Engine
from evolm.lora.layout import LoraLayout

log = logging.getLogger(__name__)


def in_multirun() -> bool:
    """True inside a job of a Hydra multirun (a sweep trial)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


class EnginePool:
    """A one-slot cache: the engine for one key, closed when another key is asked for."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.engine: Engine | None = None
        self.started = 0  # engines this pool has created (one per sweep, unless the key changes)
        self.reused = 0  # trials that got the pooled engine back

    def get(self, key: str, layout: LoraLayout, make: Callable[[], Engine]) -> Engine:
        if self.engine is not None and key == self.key:
            self.engine.use_layout(layout)
            self.reused += 1
            log.info("reusing the previous trial's engine (no reload), LoRA rank %d", layout.rank)
            return self.engine
        self.close()
        self.engine, self.key = make(), key
        self.started += 1
        return self.engine

    def drop(self, engine: Engine) -> None:
        """Forget ``engine`` (closed by its user) if it is the pooled one."""
        if engine is self.engine:
            self.engine = self.key = None

    def close(self) -> None:
        if self.engine is not None:
            engine, self.engine, self.key = self.engine, None, None
            engine.close()


POOL = EnginePool()
atexit.register(POOL.close)


def engine_key(model_path: str, server: Mapping[str, Any]) -> str:
    """What defines an engine: the model and every key of the ``server`` node (not the layout)."""
    return json.dumps({"model_path": model_path, **server}, sort_keys=True, default=str)


def open_engine(
    model_path: str,
    server: Mapping[str, Any],
    layout: LoraLayout,
    make: Callable[[], Engine],
) -> Engine:
    """The engine for this run: the pooled one in a multirun (built by ``make`` on first use or
    when the key changes), a fresh one from ``make`` otherwise. Pair with :func:`release`."""
    if not in_multirun():
        return make()
    return POOL.get(engine_key(model_path, server), layout, make)


def release(engine: Engine) -> None:
    """End of a run: keep a pooled engine for the next trial of a multirun, else close it."""
    if in_multirun() and engine is POOL.engine:
        return
    POOL.drop(engine)
    engine.close()
