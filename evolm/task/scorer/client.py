"""The client of the scorer service's JSON schema (:mod:`evolm.task.scorer.server`, or any
service that speaks it): batching, retries with backoff, and checks of every answer."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import requests
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from evolm.errors import RunAborted, ServiceUnavailable

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0


class ScorerError(RunAborted):
    """The scorer service answered, but not with scores (HTTP 4xx, a malformed body, or a
    reward/cost that is not a finite number): the run stops at once (exit 3) with this
    message, which names the service and the field."""


class ScorerUnavailable(ServiceUnavailable, ConnectionError):
    """The scorer service gave no usable answer after every retry."""


class _ServerError(Exception):
    """HTTP 5xx: retried."""


_TRANSIENT = (requests.ConnectionError, requests.Timeout, _ServerError)


class ScorerClient:
    """Client of the scorer service's JSON schema (see :mod:`evolm.task.scorer.server`).

    Requests are split into batches of ``batch_size`` completions. Connection errors, timeouts
    (``timeout_s`` per request) and HTTP 5xx are retried ``retries`` times with exponential
    backoff (``backoff_s``, ``2 * backoff_s``, ... capped at 30 s), then raise
    :class:`ScorerUnavailable`; HTTP 4xx raises :class:`ScorerError` at once (retrying a bad
    request cannot help).
    """

    def __init__(
        self,
        url: str,
        batch_size: int = 32,
        timeout_s: float = 30.0,
        retries: int = 3,
        backoff_s: float = 0.5,
    ) -> None:
        self.url = url.rstrip("/")
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.session = requests.Session()

    def health(self, quiet: bool = False) -> dict[str, Any]:
        """``GET /health`` (with retries, logged unless ``quiet``): the service is up."""
        return self._call("GET", "/health", None, quiet)

    def post(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``POST /score`` with one JSON payload (with retries); the decoded answer."""
        return self._call("POST", "/score", payload)

    def score(
        self, prompts: Sequence[str], completions: Sequence[str]
    ) -> tuple[list[float], list[float]]:
        """``(rewards, costs)`` for every completion, in batches of ``batch_size``."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        rewards: list[float] = []
        costs: list[float] = []
        for i in range(0, len(prompts), self.batch_size):
            batch = {
                "prompts": list(prompts[i : i + self.batch_size]),
                "completions": list(completions[i : i + self.batch_size]),
            }
            answer = self.post(batch)
            r, c = answer.get("rewards"), answer.get("costs")
            n = len(batch["completions"])
            if not (isinstance(r, list) and isinstance(c, list) and len(r) == len(c) == n):
                raise ScorerError(
                    f"scorer at {self.url} must answer {n} rewards and costs, got {answer!r:.200}"
                )
            rewards += self._numbers(r, "rewards", i)
            costs += self._numbers(c, "costs", i)
        return rewards, costs

    def _numbers(self, values: list[Any], field: str, offset: int) -> list[float]:
        """``values`` as floats, or ScorerError naming the first that is not a finite number
        (NaN, inf, a string, null, a bool)."""
        for j, x in enumerate(values):
            ok = isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
            if not ok:
                raise ScorerError(
                    f"scorer service at task.url={self.url} answered {field}[{offset + j}] = "
                    f"{x!r:.50}, not a finite number; fix the service's scorer (every reward and "
                    "cost must be a finite float)"
                )
        return [float(x) for x in values]

    def _call(
        self, method: str, path: str, payload: dict[str, Any] | None, quiet: bool = False
    ) -> dict[str, Any]:
        def warn(s: Any) -> None:
            if not quiet:
                log.warning(
                    "scorer %s %s failed (attempt %d): %s; retrying",
                    method,
                    self.url + path,
                    s.attempt_number,
                    s.outcome.exception() if s.outcome else "?",
                )

        retrying = Retrying(
            stop=stop_after_attempt(self.retries + 1),
            wait=wait_exponential(multiplier=self.backoff_s, max=MAX_BACKOFF_S),
            retry=retry_if_exception_type(_TRANSIENT),
            before_sleep=warn,
            reraise=True,
        )
        try:
            return retrying(self._once, method, path, payload)
        except _TRANSIENT as e:
            raise ScorerUnavailable(self._unavailable(method + " " + path, e)) from e

    def _once(self, method: str, path: str, payload: dict[str, Any] | None) -> dict[str, Any]:
        resp = self.session.request(method, self.url + path, json=payload, timeout=self.timeout_s)
        if resp.status_code >= 500:
            raise _ServerError(f"HTTP {resp.status_code}: {_error_text(resp)}")
        if resp.status_code >= 400:
            raise ScorerError(
                f"scorer at {self.url} rejected {method} {path} with HTTP {resp.status_code}: "
                f"{_error_text(resp)} (not retried)"
            )
        try:
            answer = resp.json()
        except ValueError:
            raise ScorerError(f"scorer at {self.url} answered {path} with non-JSON") from None
        if not isinstance(answer, dict):
            raise ScorerError(f"scorer at {self.url} answered {path} with {answer!r:.200}")
        return answer

    def _unavailable(self, what: str, error: Exception) -> str:
        return (
            f"scorer service at task.url={self.url} gave no usable answer to {what} after "
            f"{self.retries + 1} attempt(s) (timeout {self.timeout_s} s each); last error: "
            f"{error}. {start_hint(self.url).capitalize()}"
        )


def start_hint(url: str) -> str:
    """How to start the project's scorer service where ``url`` points."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 8765
    return (
        f"start it first: `python -m evolm.task.scorer.server --host {host} --port {port}` "
        f"(or `launchers/scorer.sh {host} {port}`), or set task.url to a running service"
    )


def short_error(error: BaseException | None) -> str:
    """``connection refused``, ``timed out``, ... rather than urllib3's paragraph."""
    text = str(error)
    for words in ("Connection refused", "timed out", "Name or service not known"):
        if words in text:
            return words.lower()
    return text[:200]


def _error_text(resp: requests.Response) -> str:
    try:
        return str(resp.json().get("error", resp.text))[:500]
    except (ValueError, AttributeError):
        return resp.text[:500]
