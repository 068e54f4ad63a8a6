"""CUDA-graph capture and per-phase timing for the fast path's generator."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def capture(fn: Callable[[], None], pool: object) -> torch.cuda.CUDAGraph:
    """Run ``fn`` once on a side stream (the warm-up: its effects are this call's, so ``fn``
    need not be idempotent), then capture it (capturing runs nothing: replays do)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        fn()
    return graph


class PhaseTimer:
    """Phase times: CUDA events on GPUs (read once, at the end), the host clock on CPUs."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = [("start", self.now())]

    def between(self, a: object, b: object) -> float:
        """Seconds from time point ``a`` to ``b`` (on GPUs after :meth:`done`)."""
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a  # type: ignore[attr-defined,operator]

    def now(self) -> object:
        """A time point (for :meth:`between`): a recorded CUDA event, or the host clock."""
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def mark(self, name: str) -> None:
        self.marks.append((name, self.now()))

    def done(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
        out = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:], strict=False):
            out[name] = self.between(a, b)
        return out
