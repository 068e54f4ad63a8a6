"""Client machinery shared by the persistent multi-LoRA servers (``server=vllm|sglang``).

One ``generate_rows`` call (one step of the engine's generation counter; ``generate`` is every
member x every prompt through it):

1. write the adapter of every member among the rows in PEFT format to tmpfs
   (:mod:`evolm.server.staging`),
2. load them concurrently under names unique per engine and generation,
3. send every row, whatever its member, in batched requests (the subclass shapes them: one
   ``/generate`` for SGLang while its adapter slots hold the members; a fleet's share of
   interleaved rows is one request, not one per set of members),
4. unload the adapters and delete their files, also when a step failed.

``last_timings`` holds the seconds of each phase of the last call: ``write_s``, ``load_s``,
``build_s`` (request building), ``generate_s`` (server time, as the client sees it),
``unload_s``, and ``overhead_s`` (everything but ``generate_s``).

Launch or attach: with ``url`` the engine attaches to a running server; otherwise it launches
one (``python -m <launch_module> ...``) on ``host`` and ``port`` (a free port when null) and
waits for ``/health``. A server that stops answering (connection errors or timeouts after
``retries`` attempts with backoff) is restarted when evolm launched it, and the whole call is
re-run under fresh names; an attached server cannot be restarted, so that is an error.
``close()`` unloads, deletes the adapter files and stops a launched server unless
``keep_alive`` (then it logs the URL to attach later runs with ``server.url=...``).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
from transformers import AutoTokenizer

from evolm.engine.base import Engine, TextRequest, chat_prompt
from evolm.errors import ConfigError
from evolm.lora.layout import LoraLayout, LoraPopulation
from evolm.sampling import Sampling
from evolm.server.connection import Server, ServerDown, ServerError, ServerProcess, free_port
from evolm.server.options import RemoteOptions
from evolm.server.staging import AdapterStage

__all__ = ["Call", "RemoteEngine", "ServerDown", "ServerError", "map_all", "settle"]
log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """One HTTP request of a generation: ``POST path`` with a JSON ``payload``, answering the
    generation's rows ``rows`` (indices, in the order of its answers)."""

    path: str
    payload: dict[str, Any]
    rows: tuple[int, ...] = ()


def map_all(
    pool: ThreadPoolExecutor, fn: Callable[..., T], args: Sequence[tuple[Any, ...]]
) -> list[T]:
    """Run ``fn(*a)`` for every ``a`` on ``pool``; wait for all, then raise the first error."""
    results, errors = settle([pool.submit(fn, *a) for a in args], Exception)
    if errors:
        raise errors[0]
    return results


def settle(
    futures: Sequence[Future[T]], catch: type[BaseException]
) -> tuple[list[T], list[BaseException]]:
    """The results of ``futures`` and the errors of type ``catch`` they raised (any other error
    propagates at once), after waiting for every one.

    Futures are awaited one by one (not ``concurrent.futures.wait``, which holds every
    future's lock at once: a Ctrl-C or SIGTERM landing there could leave them locked)."""
    results: list[T] = []
    errors: list[BaseException] = []
    for f in futures:
        try:
            results.append(f.result())
        except catch as e:
            errors.append(e)
    return results, errors


@contextlib.contextmanager
def timed(timings: dict[str, float], key: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[key] += time.perf_counter() - start


class RemoteEngine(Engine):
    """Base of the vLLM and SGLang engines (:mod:`evolm.server.vllm`, :mod:`evolm.server.sglang`).

    Subclasses set ``kind``, validate their own arguments, then call ``__init__`` here, and
    implement ``launch_args``, ``launch_env``, ``check_server``, ``load``, ``unload``,
    ``build_calls`` and ``parse``. Argument meanings are documented on the subclasses.
    """

    kind: ClassVar[str] = "remote"
    concurrent_calls: ClassVar[bool] = True  # may the calls of one generation run in parallel
    max_lora_rank: int  # the server's --max-lora-rank (set by the subclass)
    lora_target_modules: list[str] | None = None  # the modules it serves (None: all)

    def __init__(self, model_path: str, layout: LoraLayout, options: RemoteOptions) -> None:
        url, cuda_devices = options.url, options.cuda_devices
        if not (url is None or isinstance(url, str)):
            raise ConfigError("url", f"one {self.kind} server has one URL, not {url!r}", "name one")
        if not (cuda_devices is None or isinstance(cuda_devices, str | int)):
            raise ConfigError(
                "cuda_devices",
                f"one {self.kind} server sees one CUDA_VISIBLE_DEVICES, not {cuda_devices!r}",
                "name one, e.g. server.cuda_devices=0",
            )
        self.options = options
        self.model_path, self.layout = model_path, layout
        self.host, self.port, self.keep_alive = options.host, options.port, options.keep_alive
        self.python = options.python or sys.executable
        if shutil.which(self.python) is None:
            raise ConfigError("python", f"{self.python!r} is not an executable", "name one")
        self.launch_module, self.extra_args = options.launch_module, list(options.extra_args)
        self.cuda_devices = None if cuda_devices is None else str(cuda_devices)
        self.startup_timeout_s = options.startup_timeout_s
        self.request_timeout_s = options.request_timeout_s
        self.retries, self.restarts = options.retries, options.restarts
        max_workers = options.max_workers
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.run = secrets.token_hex(3)
        self.generation = 0
        self.stage = AdapterStage(self.run, model_path, self.adapter_dtype())
        self._timings: dict[str, float] = {}
        self.startup_s: float | None = None  # seconds the last launch took to become healthy
        self.pool = ThreadPoolExecutor(max(1, max_workers), thread_name_prefix=f"evolm-{self.kind}")
        self.server = Server(self.kind, self.request_timeout_s, self.retries, max_workers)
        self._closed = False
        atexit.register(self.close)
        try:
            self.server.attach(url) if url is not None else self._launch()
            self.check_server()
            if options.self_test:
                self.self_test()
        except BaseException:
            self.close()
            raise

    # -- subclass hooks ------------------------------------------------------------------
    def launch_args(self, host: str, port: int) -> list[str]:
        raise NotImplementedError

    def launch_env(self) -> dict[str, str]:
        return {}

    def check_server(self) -> None:
        """Validate the running server against the config (raise ConfigError naming the flag)."""

    def load(self, name: str, path: str) -> None:
        raise NotImplementedError

    def unload(self, name: str) -> None:
        raise NotImplementedError

    def build_calls(
        self, texts: list[str], names: list[str | None], sampling: Sampling, seed: int
    ) -> list[Call]:
        """Requests that answer every row ``i``: prompt ``texts[i]`` under adapter ``names[i]``
        (None: the base model), each :class:`Call` naming the rows it answers."""
        raise NotImplementedError

    def parse(self, answer: Any, call: Call) -> list[str]:
        """The completions of one request's answer, in the order of ``call.rows``."""
        raise NotImplementedError

    # -- the server ----------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self.server.url

    @property
    def process(self) -> ServerProcess | None:
        """The server process when evolm launched it (None when attached)."""
        return self.server.process

    def _launch(self) -> None:
        port = self.port or free_port(self.host)
        cmd = [self.python, "-m", self.launch_module, *self.launch_args(self.host, port)]
        env = {**os.environ, **self.launch_env()}
        if self.cuda_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(self.cuda_devices)
        log_path = Path(tempfile.gettempdir()) / f"evolm-{self.kind}-{port}-{self.run}.log"
        url = f"http://{self.host}:{port}"
        cmd += self.extra_args
        timeout = self.startup_timeout_s
        self.startup_s = self.server.launch(cmd, env, url, log_path, timeout, self.keep_alive)

    def _restart(self, reason: str, what: str = "re-running the generation") -> None:
        assert self.process is not None
        log.warning(
            "the %s server at %s is down (%s); restarting it and %s. Log tail:\n%s",
            *(self.kind, self.url, reason, what, self.process.tail(15)),
        )
        self._launch()
        self.check_server()

    def close(self) -> None:
        """Delete adapter files; stop a launched server unless ``keep_alive``. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.stage.close()
        self.server.close(self.keep_alive)

    # -- the Engine protocol -------------------------------------------------------------
    @property
    def last_timings(self) -> dict[str, float]:
        return dict(self._timings)

    def use_layout(self, layout: LoraLayout) -> None:
        """Serve ``layout`` on the running server: its rank and modules must fit the flags the
        server was started with (fixed for its life)."""
        if layout.rank > self.max_lora_rank:
            raise ConfigError(
                "server.max_lora_rank",
                f"the running server was started with --max-lora-rank {self.max_lora_rank}, "
                f"below this trial's lora.rank={layout.rank}",
                "set server.max_lora_rank to the largest lora.rank the sweep searches",
            )
        modules = self.lora_target_modules
        if modules is not None and not set(layout.target_modules) <= set(modules):
            raise ConfigError(
                "server.lora_target_modules",
                f"the running server serves {list(modules)}, not all of "
                f"{list(layout.target_modules)}",
                "set server.lora_target_modules to every module the sweep targets",
            )
        self.layout = layout

    def format_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        return chat_prompt(self.tokenizer, messages)

    def adapter_dtype(self) -> torch.dtype:
        """The dtype adapters are written in (fp32 unless a server says otherwise)."""
        return torch.float32

    def generate_rows(self, request: TextRequest) -> list[str]:
        """The ``(member, prompt)`` rows' completions, in their order, whatever members they
        mix: one staged generation; re-run whole (fresh adapter names) after restarting a dead
        server."""
        return self.with_restarts("re-running the generation", lambda: self._generate_once(request))

    def with_restarts(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``; when the server is down (its process exited, or ServerDown), a launched one
        is restarted and ``fn`` run again (``what`` says what, for the log), at most
        ``restarts`` times; an attached one cannot be restarted, so that is an error."""
        for restart in range(self.restarts + 1):
            if self.process is not None and not self.process.alive():
                self._restart(f"its process exited with code {self.process.popen.returncode}", what)
            try:
                return fn()
            except ServerDown as e:
                if self.process is None:
                    raise ServerDown(
                        f"{e}. evolm attached to it (server.url) and cannot restart it: restart "
                        "it by hand, or set server.url=null to let evolm launch (and restart) one"
                    ) from e
                if restart == self.restarts:
                    raise
                self._restart(str(e), what)
        raise AssertionError("unreachable")

    def _generate_once(self, request: TextRequest) -> list[str]:
        prompts, adapters, rows = request.prompts, request.adapters, list(request.rows)
        self.generation += 1
        keys = ("write_s", "load_s", "build_s", "generate_s", "unload_s")
        t = dict.fromkeys(keys, 0.0)
        names: list[str] = []
        server_up = True
        try:
            name_of: dict[int, str] = {}  # member -> its adapter's name on the server
            if adapters is not None and rows:
                members = sorted({m for m, _ in rows})
                names = list(self.stage.names(self.generation, len(members)))
                with timed(t, "write_s"):
                    paths = self.stage.write(self.generation, adapters.subset(members), self._map)
                with timed(t, "load_s"):
                    self._map(self.load, list(zip(names, paths, strict=True)))
                name_of = dict(zip(members, names, strict=True))
            with timed(t, "build_s"):
                texts = [prompts[p] for _, p in rows]
                names_of_rows = [name_of.get(m) for m, _ in rows]
                calls = self.build_calls(texts, names_of_rows, request.sampling, request.seed)
            with timed(t, "generate_s"):
                answers = self._send(calls)
            out: list[str | None] = [None] * len(rows)
            for call, answer in zip(calls, answers, strict=True):
                got = self.parse(answer, call)
                if len(got) != len(call.rows):
                    raise RuntimeError(
                        f"the {self.kind} server returned {len(got)} completions for "
                        f"{len(call.rows)} prompts"
                    )
                for i, text in zip(call.rows, got, strict=True):
                    out[i] = text
            missing = [i for i, text in enumerate(out) if text is None]
            if missing:
                raise RuntimeError(f"no request answered rows {missing[:5]} of {len(rows)}")
            return [text for text in out if text is not None]
        except ServerDown:
            server_up = False  # dead or hung: nothing to unload there (a restart forgets all)
            raise
        finally:
            with timed(t, "unload_s"):
                self._unload_all(names if server_up else [])
            self.stage.remove(self.generation)
            t["overhead_s"] = sum(t[k] for k in keys if k != "generate_s")
            self._timings = t

    def _send(self, calls: list[Call]) -> list[Any]:
        post = lambda c: self.server.request("POST", c.path, c.payload).json()  # noqa: E731
        if self.concurrent_calls:
            return self._map(post, [(c,) for c in calls])
        return [post(c) for c in calls]

    def _map(self, fn: Callable[..., Any], args: list[tuple[Any, ...]]) -> list[Any]:
        """Run ``fn(*a)`` for every ``a`` on the pool (:func:`map_all`)."""
        return map_all(self.pool, fn, args)

    def _unload_all(self, names: list[str]) -> None:
        """Unload every name once, best effort (a failed load or a dead server is expected)."""

        def unload(name: str) -> None:
            try:
                self.unload(name)
            except ServerError as e:  # 400/404: its load had failed
                level = logging.DEBUG if e.status in (400, 404) else logging.WARNING
                log.log(level, "unload %s: %s", name, e)
            except ServerDown as e:
                log.warning("unload %s: %s", name, e)

        self._map(unload, [(n,) for n in names])

    def self_test(self) -> None:
        """A large random adapter must change greedy outputs; else the server ignores weights."""
        gen = torch.Generator().manual_seed(20240917)
        tensors = [
            torch.randn(shape, generator=gen)
            / (1.0 if self.layout.is_b(i) else math.sqrt(shape[1]))
            for i, shape in enumerate(self.layout.shapes())
        ]
        prompts = ["Hello", "1, 2, 3,", self.format_chat([{"role": "user", "content": "Hi!"}])]
        sampling = Sampling(max_new_tokens=8)
        base = self.generate(prompts, None, sampling, seed=0)[0]
        tuned = self.generate(prompts, LoraPopulation.single(self.layout, tensors), sampling, 0)[0]
        if base == tuned:
            raise RuntimeError(
                f"self-test failed: the {self.kind} server at {self.url} gave the base model's "
                f"outputs {base!r} for a large random adapter, so it ignores adapter weights "
                "(LoRA disabled, or target modules it does not match). Check its LoRA flags"
            )
        log.info("self-test passed: the %s server applies adapter weights", self.kind)
