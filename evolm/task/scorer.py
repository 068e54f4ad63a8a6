"""``task=scorer``: maximise a reward model's score minus lambda times a cost model's score.

Both scores come from an HTTP scorer service (:mod:`evolm.task.scorer_server`, or anything that
speaks its JSON schema). Reward per completion: ``reward = r - lambda * c``, so a member's
fitness is ``mean(r) - lambda * mean(c)`` (the alignment objective of the ES fork for PKU
Safe-RLHF). With ``lambda_adapt`` the multiplier follows a Lagrangian rule after every
generation: ``ln lambda += lambda_lr * (mean cost - cost_threshold)``, capped at ``lambda_max``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import requests
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from evolm.errors import ConfigError, RunAborted, ServiceUnavailable
from evolm.task.base import Example, Sampling, Scores, Task, cycling_window, read_jsonl

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = "BEGINNING OF CONVERSATION: USER: {x} ASSISTANT:"
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
    """Client of the scorer service's JSON schema (see :mod:`evolm.task.scorer_server`).

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

    def health(self) -> dict[str, Any]:
        """``GET /health`` (with retries): the service is up and answering."""
        return self._call("GET", "/health", None)

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

    def _call(self, method: str, path: str, payload: dict[str, Any] | None) -> dict[str, Any]:
        retrying = Retrying(
            stop=stop_after_attempt(self.retries + 1),
            wait=wait_exponential(multiplier=self.backoff_s, max=MAX_BACKOFF_S),
            retry=retry_if_exception_type(_TRANSIENT),
            before_sleep=lambda s: log.warning(
                "scorer %s %s failed (attempt %d): %s; retrying",
                method,
                self.url + path,
                s.attempt_number,
                s.outcome.exception() if s.outcome else "?",
            ),
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
        parts = urlsplit(self.url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 8765
        return (
            f"scorer service at task.url={self.url} gave no usable answer to {what} after "
            f"{self.retries + 1} attempt(s) (timeout {self.timeout_s} s each); last error: "
            f"{error}. Start it with `python -m evolm.task.scorer_server --host {host} "
            f"--port {port}` (or `launchers/scorer.sh {host} {port}`), or set task.url to a "
            "running service"
        )


def _short(error: BaseException | None) -> str:
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


def _require(ok: bool, key: str, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(key, problem, fix)


class Scorer(Task):
    """The scorer task: prompts from a file, rewards and costs from the scorer service.

    Args:
        url: the scorer service (``python -m evolm.task.scorer_server``). Not contacted by the
            constructor; :meth:`preflight` checks its health before any model loads.
        prompts_file: JSON lines with a field ``prompt``; ``None``: evolm's bundled prompts.
        train_size: the first ``train_size`` prompts are the training split, the rest eval.
        samples_per_generation: training prompts per generation, in cycling windows.
        template: the text the model sees; ``{x}`` is replaced by the prompt (other braces are
            literal). The rendered text is also what the service receives as ``prompts``.
        lambda_init: the cost multiplier lambda (> 0) at the start.
        lambda_adapt: adapt lambda after every generation (Lagrangian rule on ln lambda).
        lambda_lr: step size of ``ln lambda += lambda_lr * (mean cost - cost_threshold)``.
        lambda_max: upper bound of lambda.
        cost_threshold: the mean cost the adaptation aims at (``d``).
        batch_size, timeout_s, retries, backoff_s: the client (see :class:`ScorerClient`).
        max_new_tokens, temperature, top_p: decoding (greedy by default).
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:8765",
        prompts_file: str | None = None,
        train_size: int = 16,
        samples_per_generation: int = 8,
        template: str = DEFAULT_TEMPLATE,
        lambda_init: float = 1.0,
        lambda_adapt: bool = False,
        lambda_lr: float = 0.005,
        lambda_max: float = 5.0,
        cost_threshold: float = 0.0,
        batch_size: int = 32,
        timeout_s: float = 30.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_p: float = 1.0,
    ) -> None:
        self.sampling = Sampling(max_new_tokens, temperature, top_p)
        _check_url(url)
        _require(
            "{x}" in template, "template", f"{template!r} lacks {{x}}", f"e.g. {DEFAULT_TEMPLATE!r}"
        )
        _check_lambda(lambda_init, lambda_lr, lambda_max)
        _check_client(batch_size, timeout_s, retries, backoff_s)
        train, held_out = split_prompts(prompts_file, train_size, samples_per_generation)
        self.template = template
        self.train = [self._example(p) for p in train]
        self.eval = [self._example(p) for p in held_out]
        self.samples_per_generation = samples_per_generation
        self.log_lambda = math.log(lambda_init)
        self.lambda_adapt = lambda_adapt
        self.lambda_lr = lambda_lr
        self.lambda_max = lambda_max
        self.cost_threshold = cost_threshold
        self.client = ScorerClient(url, batch_size, timeout_s, retries, backoff_s)
        self._checked = False

    @property
    def lambda_(self) -> float:
        """The current cost multiplier."""
        return math.exp(self.log_lambda)

    def _example(self, prompt: str) -> Example:
        return Example(prompt=self.template.replace("{x}", prompt), reference={"prompt": prompt})

    def train_examples(self, generation: int) -> list[Example]:
        return cycling_window(self.train, generation, self.samples_per_generation)

    def eval_examples(self) -> list[Example]:
        return self.eval

    def preflight(self) -> None:
        """``GET /health`` of the service before any model loads (the client's retries and
        backoff, quietly): a scorer that is not running is a ConfigError naming ``url`` and
        how to start one."""
        client, error = self.client, None
        for attempt in range(client.retries + 1):
            if attempt:
                time.sleep(min(client.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S))
            try:
                log.info("scorer service %s: %s", client.url, client._once("GET", "/health", None))
                self._checked = True
                return
            except _TRANSIENT as e:
                error = e
        parts = urlsplit(client.url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 8765
        raise ConfigError(
            "url",
            f"no scorer service answers at {client.url} ({client.retries + 1} attempt(s), "
            f"last: {_short(error)})",
            f"start it first: `python -m evolm.task.scorer_server --host {host} --port {port}` "
            f"(or `launchers/scorer.sh {host} {port}`), or set task.url to a running service",
        )

    def score(self, examples: Sequence[Example], completions: Sequence[str]) -> Scores:
        if not self._checked:  # lazily: constructing the task must not need the service
            log.info("scorer service %s: %s", self.client.url, self.client.health())
            self._checked = True
        prompts = [str(e.prompt) for e in examples]
        rewards, costs = self.client.score(prompts, completions)
        lam = self.lambda_
        return {
            "reward": [r - lam * c for r, c in zip(rewards, costs, strict=True)],
            "scorer_reward": rewards,
            "cost": costs,
        }

    def after_generation(self, scores: Mapping[str, float]) -> dict[str, float]:
        """Adapt lambda from the generation's mean cost (if enabled); logs ``train/lambda``.

        The returned lambda is the value after the update, used from the next generation on.
        """
        if self.lambda_adapt:
            step = self.lambda_lr * (scores["cost"] - self.cost_threshold)
            self.log_lambda = min(self.log_lambda + step, math.log(self.lambda_max))
        return {"lambda": self.lambda_}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this task: the adapted ``ln lambda``."""
        return {"log_lambda": self.log_lambda}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a resumed run continues with the adapted lambda)."""
        self.log_lambda = float(state["log_lambda"])


def split_prompts(
    prompts_file: str | None, train_size: int, per_generation: int
) -> tuple[list[str], list[str]]:
    """(train, eval) prompts from ``prompts_file`` (or the bundled file), checked."""
    path = prompts_file or str(resources.files("evolm") / "data" / "scorer" / "prompts.jsonl")
    prompts = [str(r["prompt"]) for r in read_jsonl(path, "prompts_file", ("prompt",))]
    n = len(prompts)
    _require(
        1 <= train_size < n,
        "train_size",
        f"must be in [1, {n - 1}] for {n} prompts (the rest is eval), got {train_size}",
        "lower train_size or add prompts",
    )
    _require(
        1 <= per_generation <= train_size,
        "samples_per_generation",
        f"must be in [1, train_size={train_size}], got {per_generation}",
        "e.g. 8",
    )
    return prompts[:train_size], prompts[train_size:]


def _check_url(url: str) -> None:
    parts = urlsplit(url)
    _require(
        parts.scheme in ("http", "https") and bool(parts.netloc),
        "url",
        f"{url!r} is not an http(s) URL",
        "e.g. url=http://127.0.0.1:8765",
    )


def _check_lambda(lambda_init: float, lambda_lr: float, lambda_max: float) -> None:
    _require(lambda_init > 0, "lambda_init", f"must be > 0, got {lambda_init}", "e.g. 1.0")
    _require(
        lambda_max >= lambda_init,
        "lambda_max",
        f"must be >= lambda_init={lambda_init}, got {lambda_max}",
        "e.g. 5.0",
    )
    _require(lambda_lr >= 0, "lambda_lr", f"must be >= 0, got {lambda_lr}", "e.g. 0.005")


def _check_client(batch_size: int, timeout_s: float, retries: int, backoff_s: float) -> None:
    _require(batch_size >= 1, "batch_size", f"must be >= 1, got {batch_size}", "e.g. 32")
    _require(timeout_s > 0, "timeout_s", f"must be > 0, got {timeout_s}", "e.g. 30")
    _require(retries >= 0, "retries", f"must be >= 0, got {retries}", "e.g. 3")
    _require(backoff_s >= 0, "backoff_s", f"must be >= 0, got {backoff_s}", "e.g. 0.5")
