"""A small HTTP scorer service (standard library only): a reward and a cost per completion.

    python -m evolm.task.scorer_server --host 127.0.0.1 --port 8765 [--rule length]
    python -m evolm.task.scorer_server --scorer mypackage.models:SafetyScorer

JSON schema:

* ``POST /score`` with ``{"prompts": [str], "completions": [str]}`` (equal lengths) answers
  ``{"rewards": [float], "costs": [float]}``, one pair per completion. A malformed request
  answers 400 with ``{"error": "..."}``; a scorer that fails answers 500 with ``{"error"}``.
* ``GET /health`` answers ``{"status": "ok", "scorer": "<name>"}``.
* ``GET /stats`` answers ``{"score_requests": int, "items": int}``: ``POST /score`` requests
  received (failed ones included) and completions scored, for tests and monitoring.

What computes the scores is a :class:`Scorer`: a built-in rule (``--rule``, see :data:`RULES`)
or any class ``module:Class`` (``--scorer``) constructed without arguments, e.g. a reward model
and a cost model. ``--fail-first N`` answers 500 to the first N score requests and ``--delay S``
sleeps S seconds before answering each one; both exist to test clients' retries and timeouts.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import re
import threading
import time
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


class LengthRule:
    """``--rule length``: reward the share of distinct words, cost the length.

    reward = distinct words / words (1.0 for text that never repeats a word, 0.0 for empty
    text); cost = characters / 100. A perturbed model moves both by stopping earlier or
    repeating itself less, so even a tiny random model shows the trade-off.
    """

    def score(
        self, prompts: Sequence[str], completions: Sequence[str]
    ) -> tuple[list[float], list[float]]:
        rewards, costs = [], []
        for text in completions:
            words = _WORD.findall(text.lower())
            rewards.append(len(set(words)) / len(words) if words else 0.0)
            costs.append(len(text) / 100)
        return rewards, costs


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
        rewards, costs = [], []
        for text in completions:
            words = _WORD.findall(text.lower())
            rewards.append(float(sum(w in self.POLITE for w in words)))
            costs.append(float(sum(w in self.UNSAFE for w in words)))
        return rewards, costs


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
    """The request body does not follow the schema (answered with 400)."""


def parse_request(body: bytes) -> tuple[list[str], list[str]]:
    """``(prompts, completions)`` from a ``POST /score`` body, or :class:`BadRequest`."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"body is not valid JSON: {e}") from None
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


class ScorerHTTPServer(ThreadingHTTPServer):
    """The service: a :class:`Scorer` plus the test knobs and request counters."""

    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], scorer: Scorer, fail_first: int = 0, delay_s: float = 0.0
    ) -> None:
        super().__init__(address, ScoreHandler)
        self.scorer = scorer
        self.fail_first = fail_first
        self.delay_s = delay_s
        self.lock = threading.Lock()
        self.score_requests = 0
        self.items = 0

    def next_request(self) -> int:
        """Count one score request; returns its 1-based number."""
        with self.lock:
            self.score_requests += 1
            return self.score_requests


class ScoreHandler(BaseHTTPRequestHandler):
    """Routes ``GET /health``, ``GET /stats`` and ``POST /score``."""

    server: ScorerHTTPServer

    def do_GET(self) -> None:
        if self.path == "/health":
            self.reply(HTTPStatus.OK, {"status": "ok", "scorer": type(self.server.scorer).__name__})
        elif self.path == "/stats":
            with self.server.lock:
                stats = {"score_requests": self.server.score_requests, "items": self.server.items}
            self.reply(HTTPStatus.OK, stats)
        else:
            self.reply(HTTPStatus.NOT_FOUND, {"error": f"no such endpoint: GET {self.path}"})

    def do_POST(self) -> None:
        try:
            body = self.read_body()  # read first: unread bytes would reset the connection
        except BadRequest as e:
            self.reply(HTTPStatus.BAD_REQUEST, {"error": str(e)})
            return
        if self.path != "/score":
            self.reply(HTTPStatus.NOT_FOUND, {"error": f"no such endpoint: POST {self.path}"})
            return
        number = self.server.next_request()
        if self.server.delay_s > 0:
            time.sleep(self.server.delay_s)
        if number <= self.server.fail_first:
            self.reply(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"injected failure {number}"})
            return
        try:
            prompts, completions = parse_request(body)
        except BadRequest as e:
            self.reply(HTTPStatus.BAD_REQUEST, {"error": str(e)})
            return
        try:
            rewards, costs = self.server.scorer.score(prompts, completions)
            payload = {"rewards": [float(r) for r in rewards], "costs": [float(c) for c in costs]}
            if not len(rewards) == len(costs) == len(completions):
                raise ValueError(f"{len(completions)} completions but {len(rewards)} rewards")
        except Exception as e:
            log.exception("scorer failed")
            self.reply(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"scorer failed: {e!r}"})
            return
        with self.server.lock:
            self.server.items += len(completions)
        self.reply(HTTPStatus.OK, payload)

    def read_body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise BadRequest("a Content-Length header is required") from None
        if not 0 <= length <= MAX_BODY_BYTES:
            raise BadRequest(f"Content-Length must be in [0, {MAX_BODY_BYTES}], got {length}")
        return self.rfile.read(length)

    def reply(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - %s", self.address_string(), format % args)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m evolm.task.scorer_server", description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any free)")
    p.add_argument("--rule", choices=sorted(RULES), default="length", help="built-in scorer")
    p.add_argument("--scorer", help="module:Class of your own Scorer (overrides --rule)")
    p.add_argument("--fail-first", type=int, default=0, help="answer 500 to the first N")
    p.add_argument("--delay", type=float, default=0.0, help="sleep S s before each /score answer")
    p.add_argument("--log-level", default="INFO", help="logging level (DEBUG logs requests)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    scorer = load_scorer(args.scorer) if args.scorer else RULES[args.rule]()
    server = ScorerHTTPServer((args.host, args.port), scorer, args.fail_first, args.delay)
    host, port = server.server_address[:2]
    log.info("scorer service (%s) on http://%s:%d", type(scorer).__name__, host, port)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log.info("stopped")
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
