"""How evolm reaches a persistent server (``server=sglang|vllm``): one options object.

The config keeps its flat keys (``server.url``, ``server.retries``, ...); the composition root
(:func:`evolm.app.build.build_server`) gathers the keys named here into one :class:`RemoteOptions`
and passes it to the engine (or to :func:`evolm.server.sglang.sglang_servers`, which gives
each server of a fleet its own copy).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RemoteOptions:
    """Launch or attach, and how patiently to talk to the server.

    Args:
        launch_module: ``python -m <launch_module>`` starts a server (``sglang.launch_server``,
            ``vllm.entrypoints.openai.api_server``; ``evolm.testing.sglang_standin``: the CPU
            stand-in of the tests).
        url: attach to a running server instead of launching one (a list: a fleet, SGLang).
        host, port: where a launched server listens (``port=None``: a free port).
        python: the server's interpreter (``None``: this one).
        extra_args: more server flags.
        cuda_devices: ``CUDA_VISIBLE_DEVICES`` of a launched server (``None``: inherited; a
            list: one server per entry, SGLang).
        keep_alive: leave a launched server running after ``close()`` (attach later runs).
        startup_timeout_s: how long a launched server may take to answer ``/health``.
        request_timeout_s: per HTTP request; a request that times out counts as a failure.
        retries: extra attempts (with backoff) after a connection error or timeout.
        restarts: how often one ``generate`` call may restart a dead launched server.
        self_test: at start, prove that a random adapter changes the outputs.
        max_workers: threads for writing, loading, unloading and parallel requests.
    """

    launch_module: str
    url: str | Sequence[str] | None = None
    host: str = "127.0.0.1"
    port: int | None = None
    python: str | None = None
    extra_args: Sequence[str] = ()
    cuda_devices: str | Sequence[str] | None = None
    keep_alive: bool = False
    startup_timeout_s: float = 900.0
    request_timeout_s: float = 600.0
    retries: int = 3
    restarts: int = 2
    self_test: bool = True
    max_workers: int = 16

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_args", tuple(str(a) for a in self.extra_args))
        object.__setattr__(self, "retries", max(0, self.retries))
        object.__setattr__(self, "restarts", max(0, self.restarts))

    def replace(self, **changes: object) -> RemoteOptions:
        """A copy with ``changes`` (one server of a fleet: its URL, port or GPU)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


OPTION_KEYS = tuple(f.name for f in dataclasses.fields(RemoteOptions))
"""The ``server.*`` keys that make up :class:`RemoteOptions`."""
