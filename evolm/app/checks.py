"""The run's config checks that need no model: run-wide keys, the objective, what
``es.mean=full`` needs of the engine, and the services a task needs (its preflight)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from evolm.errors import ConfigError
from evolm.task.base import Task


def check_objectives(names: Any) -> None:
    """``optimized_metric`` is a metric name or a non-empty list of them."""
    if isinstance(names, str):
        return
    if isinstance(names, Sequence) and names and all(isinstance(n, str) for n in names):
        return
    raise ConfigError(
        "optimized_metric",
        f"must be a metric name or a non-empty list of names, got {names!r}",
        "e.g. optimized_metric=eval/reward_mean or '[eval/reward_mean,eval/kl_mean]'",
    )


def check_run_keys(cfg: DictConfig) -> None:
    if cfg.generations < 1:
        raise ConfigError(
            "generations", f"must be >= 1, got {cfg.generations}", "e.g. generations=50"
        )
    if cfg.eval_every < 1:
        raise ConfigError(
            "eval_every",
            f"must be >= 1, got {cfg.eval_every}",
            "e.g. eval_every=10 (the mean is also evaluated at start and end)",
        )
    for key in ("time_budget_s", "eval_every_s"):
        value = cfg[key]
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(
                key,
                f"must be > 0 seconds of training time, or null, got {value}",
                f"e.g. {key}=1200 (time/train_s counts generate, score and update only)",
            )
    check_objectives(cfg.optimized_metric)
    best = cfg.get("keep_best")
    if best is not None and (not isinstance(best, str) or "/" not in best):
        raise ConfigError(
            "keep_best",
            f"must name a metric of the mean's evaluations, or be null, got {best!r}",
            "e.g. keep_best=eval/accuracy_mean (countdown) or keep_best=eval/reward_mean",
        )


def preflight(task: Task, group: str = "task") -> None:
    """The task's check of what it needs outside the process (``Task.preflight``)."""
    try:
        task.preflight()
    except ConfigError as e:
        raise e.in_group(group) from None


FULL_SERVERS = ("evolm.engine.local.LocalEngine", "evolm.server.sglang.sglang_servers")
"""The engines whose base weights ``es.mean=full`` can replace (``Engine.update_base_weights``)."""


def check_full_mode(cfg: DictConfig) -> None:
    """``es.mean=full`` needs an engine that can replace its base weights: a ConfigError naming
    both keys otherwise, before any model loads."""
    if cfg.es.get("mean", "lora") != "full":
        return
    objectives = cfg.get("optimized_metric")
    wanted = [objectives] if isinstance(objectives, str) else list(objectives or [])
    kl = [m for m in wanted if str(m).startswith("eval/kl")]
    if kl:
        raise ConfigError(
            "optimized_metric",
            f"{kl} is not logged with es.mean=full (the served base is the mean itself: there is "
            "no adapter to compare with the base)",
            "optimize eval/reward_mean, or use es.mean=lora (hparams_search=es_pareto needs it)",
        )
    target = str(cfg.server.get("_target_", ""))
    if target not in FULL_SERVERS:
        server = (
            HydraConfig.get().runtime.choices.get("server") if HydraConfig.initialized() else None
        )
        raise ConfigError(
            "es.mean",
            f"full replaces the served base weights after every update; server="
            f"{server or target} cannot (vLLM has no HTTP endpoint that reloads the served "
            "weights: docs/servers.md)",
            "use server=local or server=sglang with es.mean=full, or es.mean=lora with this server",
        )
