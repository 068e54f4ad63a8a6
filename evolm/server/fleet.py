"""Several servers as one engine: one persistent server per GPU, rows sharded over them.

SGLang's own data parallelism refuses dynamic LoRA loading (``--dp-size 2``: "dp_size must be 1
... for dynamic lora loading"), so scaling ``server=sglang`` over K GPUs means K servers. A
:class:`Fleet` holds K engines (each its own server, launched on one GPU or attached by URL,
each with its own watchdog: a dead launched server is restarted by its engine) and splits every
generation's (member, prompt) rows over them, interleaved (row ``i`` to server ``i mod K``, the
same split as :mod:`evolm.dist`), so the servers finish together; each server loads the
adapters of the members its rows need (with K below the prompt count: every member, on every
server). The fleet is one engine to the rest of evolm: the sweep's engine pool keeps it (all
its servers) across trials and :meth:`Fleet.use_layout` re-points every server.

With ``es.mean=full`` the fleet writes each new base model once, to one folder, and every server
loads that folder (all at once): one copy per update instead of one per server (K copies of a
7B model's 15 GB in tmpfs, and K times the writing). A folder is deleted once no server serves it.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from evolm.engine.base import Engine, TextRequest
from evolm.lora.layout import LoraLayout
from evolm.server.remote import map_all, settle

log = logging.getLogger(__name__)


@runtime_checkable
class SharedBase(Protocol):
    """A server engine whose base weights come from a folder any server can load
    (:class:`~evolm.server.sglang.SGLangEngine`)."""

    base_path: Path | None

    def write_base(self, named: Mapping[str, Any]) -> Path: ...

    def load_base(self, path: Path | None) -> Path | None: ...


def start_all(makers: Sequence[Callable[[], Engine]]) -> list[Engine]:
    """Build every engine at once (servers start in parallel); if one fails, close the others
    and raise its error."""
    with ThreadPoolExecutor(max(1, len(makers)), thread_name_prefix="evolm-fleet") as pool:
        engines, errors = settle([pool.submit(make) for make in makers], BaseException)
    if errors:
        for engine in engines:
            engine.close()
        raise errors[0]
    return engines


class Fleet(Engine):
    """``engines`` (one per server) answering each generation's rows together."""

    def __init__(self, engines: Sequence[Engine]) -> None:
        if not engines:
            raise ValueError("a fleet needs at least one engine")
        self.engines = list(engines)
        self.layout = self.engines[0].layout
        self.pool = ThreadPoolExecutor(len(self.engines), thread_name_prefix="evolm-fleet")
        self._timings: dict[str, float] = {}
        log.info("a fleet of %d servers: %s", len(self.engines), self.urls)

    @property
    def urls(self) -> list[str]:
        return [str(getattr(e, "url", "?")) for e in self.engines]

    def format_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        return self.engines[0].format_chat(messages)

    def generate_rows(self, request: TextRequest) -> list[str]:
        """Row ``i`` goes to server ``i mod K``; every server's share runs concurrently."""
        k, rows = len(self.engines), request.rows
        shares = [list(rows[s::k]) for s in range(k)]
        futures = [
            self.pool.submit(engine.generate_rows, replace(request, rows=share))
            for engine, share in zip(self.engines, shares, strict=True)
            if share
        ]
        answers = [f.result() for f in futures]  # the first server error propagates
        out: list[str] = [""] * len(rows)
        for s, texts in enumerate(answers):
            out[s::k] = texts
        timings = [e.last_timings for e in self.engines[: len(answers)]]
        # the slowest server sets the pace: report each phase's maximum
        self._timings = {key: max(t.get(key, 0.0) for t in timings) for t in timings for key in t}
        return out

    @property
    def last_timings(self) -> dict[str, float]:
        return dict(self._timings)

    def update_base_weights(self, named: Mapping[str, Any]) -> None:
        """``es.mean=full``: the new base weights written once (the first server's
        :meth:`~SharedBase.write_base`), then loaded by every server at once; the folders no
        server serves any more are deleted (a server whose load failed keeps its previous one).
        Engines that cannot share a folder each write and load their own, all at once."""
        if not all(isinstance(e, SharedBase) for e in self.engines):
            map_all(self.pool, lambda e: e.update_base_weights(named), [(e,) for e in self.engines])
            return
        path = self.engines[0].write_base(named)  # type: ignore[attr-defined]
        self._load_everywhere(path)

    def restore_base_weights(self) -> None:
        """Every server serves the launch model's own weights again (after ``es.mean=full``),
        all at once."""
        if not all(isinstance(e, SharedBase) for e in self.engines):
            map_all(self.pool, lambda e: e.restore_base_weights(), [(e,) for e in self.engines])
            return
        self._load_everywhere(None)

    def _load_everywhere(self, path: Path | None) -> None:
        """Every server loads ``path`` (None: the launch model); then the folders written by
        :meth:`update_base_weights` that no server serves are deleted, whatever failed."""
        shared: list[SharedBase] = [e for e in self.engines if isinstance(e, SharedBase)]
        folders = {e.base_path for e in shared} | {path}
        try:
            map_all(self.pool, lambda e: e.load_base(path), [(e,) for e in shared])
        finally:
            for folder in folders - {e.base_path for e in shared} - {None}:
                shutil.rmtree(folder, ignore_errors=True)  # type: ignore[arg-type]

    def use_layout(self, layout: LoraLayout) -> None:
        for engine in self.engines:
            engine.use_layout(layout)
        self.layout = layout

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        for engine in self.engines:
            engine.close()
