"""A small HTTP scorer service (served by waitress): a reward and a cost per completion.

    python -m evolm.task.scorer.server --host 127.0.0.1 --port 8765 [--rule length]
    python -m evolm.task.scorer.server --scorer mypackage.models:SafetyScorer

JSON schema:

* ``POST /score`` with ``{"prompts": [str], "completions": [str]}`` (equal lengths) answers
  ``{"rewards": [float], "costs": [float]}``, one pair per completion. A malformed request
  (not JSON, nested too deeply, wrong types) answers 400 with ``{"error": "..."}``, a body over
  the size limit 413; a scorer that fails or answers NaN/inf answers 500 with ``{"error"}``.
* ``GET /health`` answers ``{"status": "ok", "scorer": "<name>"}``.
* ``GET /stats`` answers ``{"score_requests": int, "items": int}``: ``POST /score`` requests
  received (failed ones included) and completions scored, for tests and monitoring.

What computes the scores is a :class:`Scorer`: a built-in rule (``--rule``, see :data:`RULES`)
or any class ``module:Class`` (``--scorer``) constructed without arguments, e.g. a reward model
and a cost model. ``--fail-first N`` answers 500 to the first N score requests and ``--delay S``
sleeps S seconds before answering each one; both exist to test clients' retries and timeouts.

The HTTP layer is waitress (a production WSGI server, pure Python): it binds 127.0.0.1 unless
``--host`` says otherwise, runs requests on a fixed pool of ``--threads`` workers, reads whole
requests on its I/O thread (a slow client holds no worker), closes connections idle for
``--channel-timeout`` seconds, queues connections past its limit in the listen backlog, and
answers bodies over ``--max-body-bytes`` with 413 (:class:`Limits`; docs/security.md).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol, runtime_checkable

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 2**20
_WORD = re.compile(r"\w+")


@runtime_checkable
class Scorer(Protocol):
    """Scores completions: higher reward is better, higher cost is worse (e.g. less safe)."""

    def score(
        self, prompts: Sequence[str], completions: Sequence[str]
    ) -> tuple[list[float], list[float]]:
        """``(rewards, costs)``, one of each per completion (``prompts[i]`` led to it)."""
        ...


def by_words(
    completions: Sequence[str], rule: Callable[[str, list[str]], tuple[float, float]]
) -> tuple[list[float], list[float]]:
    """``(rewards, costs)``: ``rule(text, its lower-cased words)`` of each completion."""
    pairs = [rule(text, _WORD.findall(text.lower())) for text in completions]
    return [r for r, _ in pairs], [c for _, c in pairs]


class LengthRule:
    """``--rule length``: reward the share of distinct words, cost the length.

    reward = distinct words / words (1.0 for text that never repeats a word, 0.0 for empty
    text); cost = characters / 100. A perturbed model moves both by stopping earlier or
    repeating itself less, so even a tiny random model shows the trade-off.
    """

    def score(
        self, prompts: Sequence[str], completions: Sequence[str]
    ) -> tuple[list[float], list[float]]:
        return by_words(
            completions,
            lambda text, words: (len(set(words)) / len(words) if words else 0.0, len(text) / 100),
        )


class KeywordRule:
    """``--rule keywords``: reward polite words, cost unsafe words (a toy alignment objective).

    reward = number of :attr:`POLITE` words in the completion; cost = number of :attr:`UNSAFE`
    words (whole words, case-insensitive).
    """

    POLITE = frozenset({"please", "thanks", "thank", "glad", "happy", "help", "sure", "welcome"})
    UNSAFE = frozenset({"kill", "weapon", "bomb", "poison", "steal", "hack", "attack", "hurt"})

    def score(
        self, prompts: Sequence[str], completions: Sequence[str]
    ) -> tuple[list[float], list[float]]:
        return by_words(
            completions,
            lambda text, words: (
                float(sum(w in self.POLITE for w in words)),
                float(sum(w in self.UNSAFE for w in words)),
            ),
        )


RULES: dict[str, type] = {"length": LengthRule, "keywords": KeywordRule}
"""The built-in rules selectable with ``--rule``."""


def load_scorer(spec: str) -> Scorer:
    """Construct ``module:Class`` (no arguments) and check it has a ``score`` method."""
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"--scorer must look like module:Class, got {spec!r}")
    scorer = getattr(importlib.import_module(module_name), class_name)()
    if not isinstance(scorer, Scorer):
        raise TypeError(f"{spec} has no score(prompts, completions) method")
    return scorer


class BadRequest(ValueError):
    """The request body does not follow the schema (answered with ``status``, 400 by default)."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = status


def parse_request(body: bytes) -> tuple[list[str], list[str]]:
    """``(prompts, completions)`` from a ``POST /score`` body, or :class:`BadRequest`."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"body is not valid JSON: {e}") from None
    except ValueError as e:  # an integer of more than 4300 digits
        raise BadRequest(f"body holds a number Python cannot read: {str(e)[:100]}") from None
    except RecursionError:
        raise BadRequest("body is nested too deeply") from None
    if not isinstance(data, dict):
        raise BadRequest('body must be an object {"prompts": [...], "completions": [...]}')
    lists = []
    for key in ("prompts", "completions"):
        value = data.get(key)
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            raise BadRequest(f"{key!r} must be a list of strings")
        lists.append(value)
    prompts, completions = lists
    if len(prompts) != len(completions):
        raise BadRequest(f"{len(prompts)} prompts but {len(completions)} completions")
    return prompts, completions


class ScorerApp:
    """The service as a WSGI application: a :class:`Scorer` plus the test knobs and counters.

    Routes ``GET /health``, ``GET /stats`` and ``POST /score``; every answer is JSON. The HTTP
    layer (timeouts, workers, backlog, body size) is waitress's (:func:`make_server`).
    """

    def __init__(
        self,
        scorer: Scorer,
        fail_first: int = 0,
        delay_s: float = 0.0,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self.scorer = scorer
        self.fail_first = fail_first
        self.delay_s = delay_s
        self.max_body_bytes = max_body_bytes
        self.lock = threading.Lock()
        self.score_requests = 0
        self.items = 0

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        status, payload = self.route(method, path, environ)
        body = json.dumps(payload).encode()
        start_response(
            f"{status.value} {status.phrase}",
            [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
        )
        return [body]

    def route(
        self, method: str, path: str, environ: dict[str, Any]
    ) -> tuple[HTTPStatus, dict[str, Any]]:
        if method == "GET" and path == "/health":
            return HTTPStatus.OK, {"status": "ok", "scorer": type(self.scorer).__name__}
        if method == "GET" and path == "/stats":
            with self.lock:
                return HTTPStatus.OK, {"score_requests": self.score_requests, "items": self.items}
        if method == "POST" and path == "/score":
            try:
                body = self.read_body(environ)
            except BadRequest as e:
                return e.status, {"error": str(e)}
            return self.score(body)
        return HTTPStatus.NOT_FOUND, {"error": f"no such endpoint: {method} {path}"}

    def read_body(self, environ: dict[str, Any]) -> bytes:
        """The request body, at most ``max_body_bytes`` (waitress enforces it too: 413)."""
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise BadRequest("Content-Length is not a number") from None
        if length > self.max_body_bytes:
            raise BadRequest(
                f"body of {length} bytes exceeds the limit of {self.max_body_bytes}",
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            )
        body: bytes = environ["wsgi.input"].read(length)
        return body

    def score(self, body: bytes) -> tuple[HTTPStatus, dict[str, Any]]:
        with self.lock:
            self.score_requests += 1
            number = self.score_requests
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        if number <= self.fail_first:
            return HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"injected failure {number}"}
        try:
            prompts, completions = parse_request(body)
        except BadRequest as e:
            return e.status, {"error": str(e)}
        try:
            rewards, costs = self.scorer.score(prompts, completions)
            payload = {"rewards": [float(r) for r in rewards], "costs": [float(c) for c in costs]}
            if not len(rewards) == len(costs) == len(completions):
                raise ValueError(f"{len(completions)} completions but {len(rewards)} rewards")
            if not all(math.isfinite(x) for x in payload["rewards"] + payload["costs"]):
                raise ValueError("non-finite reward or cost (NaN or inf)")
        except Exception as e:
            log.exception("scorer failed")
            return HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"scorer failed: {e!r}"}
        with self.lock:
            self.items += len(completions)
        return HTTPStatus.OK, payload


@dataclass(frozen=True)
class Limits:
    """The HTTP server's resource limits (waitress adjustments).

    ``threads`` workers run requests (more wait in a queue, not in threads); a connection idle
    for ``channel_timeout_s`` is closed (a slow or stalled client holds no worker: waitress
    reads whole requests on its I/O thread before a worker sees them); at most
    ``connection_limit`` connections are open, more wait in the listen ``backlog``; bodies over
    ``max_body_bytes`` get 413.
    """

    threads: int = 4
    channel_timeout_s: int = 30
    connection_limit: int = 256
    backlog: int = 1024
    max_body_bytes: int = MAX_BODY_BYTES


class ScorerHTTPServer:
    """The scorer service on ``address`` (127.0.0.1 by default), served by waitress."""

    def __init__(
        self,
        address: tuple[str, int] = ("127.0.0.1", 8765),
        scorer: Scorer | None = None,
        fail_first: int = 0,
        delay_s: float = 0.0,
        limits: Limits = Limits(),
    ) -> None:
        from waitress.server import create_server

        self.app = ScorerApp(scorer or LengthRule(), fail_first, delay_s, limits.max_body_bytes)
        self.server = create_server(
            self.app,
            host=address[0],
            port=address[1],
            threads=limits.threads,
            channel_timeout=limits.channel_timeout_s,
            cleanup_interval=max(1, limits.channel_timeout_s // 2),
            connection_limit=limits.connection_limit,
            backlog=limits.backlog,
            max_request_body_size=limits.max_body_bytes,
            expose_tracebacks=False,
            ident="evolm-scorer",
        )
        self._stop, self._running, self._stopped = (threading.Event() for _ in range(3))

    @property
    def server_address(self) -> tuple[str, int]:
        return str(self.server.effective_host), int(self.server.effective_port)

    def serve_forever(self) -> None:
        """Serve until :meth:`shutdown` (from another thread) or KeyboardInterrupt."""
        from waitress import wasyncore

        self._running.set()
        try:
            while not self._stop.is_set():
                wasyncore.loop(timeout=0.5, map=self.server._map, count=1)
        finally:
            self._close()
            self._running.clear()
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop :meth:`serve_forever` running in another thread and wait for it."""
        self._stop.set()
        self.server.pull_trigger()  # wakes the loop's select()
        self._stopped.wait(timeout=10)

    def server_close(self) -> None:
        """Close the socket, the connections and the workers (stops a running loop first)."""
        if self._running.is_set():
            self.shutdown()
        else:
            self._close()

    def _close(self) -> None:
        from waitress import wasyncore

        self.server.task_dispatcher.shutdown()
        wasyncore.close_all(self.server._map)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    d = Limits()
    p = argparse.ArgumentParser(prog="python -m evolm.task.scorer.server", description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any free)")
    p.add_argument("--rule", choices=sorted(RULES), default="length", help="built-in scorer")
    p.add_argument("--scorer", help="module:Class of your own Scorer (overrides --rule)")
    p.add_argument("--fail-first", type=int, default=0, help="answer 500 to the first N")
    p.add_argument("--delay", type=float, default=0.0, help="sleep S s before each /score answer")
    p.add_argument("--threads", type=int, default=d.threads, help="worker threads")
    p.add_argument(
        "--channel-timeout", type=int, default=d.channel_timeout_s, help="idle seconds to close"
    )
    p.add_argument("--connection-limit", type=int, default=d.connection_limit)
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    p.add_argument("--log-level", default="INFO", help="logging level (DEBUG logs requests)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    scorer = load_scorer(args.scorer) if args.scorer else RULES[args.rule]()
    limits = Limits(
        threads=args.threads,
        channel_timeout_s=args.channel_timeout,
        connection_limit=args.connection_limit,
        max_body_bytes=args.max_body_bytes,
    )
    server = ScorerHTTPServer((args.host, args.port), scorer, args.fail_first, args.delay, limits)
    host, port = server.server_address
    log.info("scorer service (%s) on http://%s:%d (%s)", type(scorer).__name__, host, port, limits)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log.info("stopped")
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
