"""``task=scorer``: maximise a reward model's score minus lambda times a cost model's score.

Both scores come from an HTTP scorer service (:mod:`evolm.task.scorer.server`, or anything that
speaks its JSON schema). Reward per completion: ``reward = r - lambda * c``, so a member's
fitness is ``mean(r) - lambda * mean(c)`` (the alignment objective of the ES fork for PKU
Safe-RLHF). With ``lambda_adapt`` the multiplier follows a Lagrangian rule after every
generation: ``ln lambda += lambda_lr * (mean cost - cost_threshold)``, capped at ``lambda_max``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from evolm.errors import ConfigError
from evolm.task.base import Example, Sampling, Scores, Task, cycling_window, read_jsonl
from evolm.task.scorer.client import (
    ScorerClient,
    ScorerError,
    ScorerUnavailable,
    short_error,
    start_hint,
)

log = logging.getLogger(__name__)
__all__ = ["Scorer", "ScorerClient", "ScorerError", "ScorerUnavailable", "split_prompts"]

DEFAULT_TEMPLATE = "BEGINNING OF CONVERSATION: USER: {x} ASSISTANT:"


def _require(ok: bool, key: str, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(key, problem, fix)


class Scorer(Task):
    """The scorer task: prompts from a file, rewards and costs from the scorer service.

    Args:
        url: the scorer service (``python -m evolm.task.scorer.server``). Not contacted by the
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
        client = self.client
        try:
            log.info("scorer service %s: %s", client.url, client.health(quiet=True))
        except ScorerUnavailable as e:
            raise ConfigError(
                "url",
                f"no scorer service answers at {client.url} ({client.retries + 1} attempt(s), "
                f"last: {short_error(e.__cause__)})",
                start_hint(client.url),
            ) from None
        self._checked = True

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
