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
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from evolm.engine.base import Engine, Row, every_member
from evolm.lora.layout import LoraLayout, LoraPopulation
from evolm.sampling import Sampling
from evolm.server.remote import map_all

log = logging.getLogger(__name__)


def start_all(makers: Sequence[Callable[[], Engine]]) -> list[Engine]:
    """Build every engine at once (servers start in parallel); if one fails, close the others
    and raise its error."""
    with ThreadPoolExecutor(max(1, len(makers)), thread_name_prefix="evolm-fleet") as pool:
        futures = [pool.submit(make) for make in makers]
        engines, errors = [], []
        for f in futures:
            try:
                engines.append(f.result())
            except BaseException as e:
                errors.append(e)
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

    def generate(
        self, prompts: Sequence[str], adapters: LoraPopulation | None, sampling: Sampling, seed: int
    ) -> list[list[str]]:
        return every_member(self, prompts, adapters, sampling, seed)

    def generate_rows(
        self,
        prompts: Sequence[str],
        adapters: LoraPopulation | None,
        rows: Sequence[Row],
        sampling: Sampling,
        seed: int,
    ) -> list[str]:
        """Row ``i`` goes to server ``i mod K``; every server's share runs concurrently."""
        k = len(self.engines)
        shares = [list(rows[s::k]) for s in range(k)]
        futures = [
            self.pool.submit(engine.generate_rows, prompts, adapters, share, sampling, seed)
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
        """``es.mean=full``: every server writes and loads the new base weights, all at once
        (one after another, a generation waited K times one server's write and load)."""
        map_all(self.pool, lambda e: e.update_base_weights(named), [(e,) for e in self.engines])

    def restore_base_weights(self) -> None:
        """Every server serves the launch model's own weights again (after ``es.mean=full``),
        all at once."""
        map_all(self.pool, lambda e: e.restore_base_weights(), [(e,) for e in self.engines])

    def use_layout(self, layout: LoraLayout) -> None:
        for engine in self.engines:
            engine.use_layout(layout)
        self.layout = layout

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        for engine in self.engines:
            engine.close()
