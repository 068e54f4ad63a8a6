"""The parts of an evolm run that a baseline shares with it, built from evolm's own config.

A baseline composes evolm's root config (``conf/config.yaml``) with the same command-line
overrides as the ES run (``model=... task=... lora.rank=...``), so the task (puzzles, prompt,
reward, stop strings, held-out split), the model folder and the LoRA layout are the ones
``python -m evolm`` builds from them, by the composition root's own builders.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import evolm.config  # noqa: F401  (registers the schemas and resolvers)
from evolm.__main__ import CONF_DIR
from evolm.app.build import (
    Builder,
    build_server,
    build_task,
    checked_engine,
    load_layout,
    local_model_dir,
)
from evolm.app.build import resolve_model as resolve_model_path
from evolm.app.checks import check_run_keys
from evolm.engine.base import Engine
from evolm.errors import ConfigError
from evolm.lora import LoraLayout
from evolm.preflight.compose_check import check_command_line
from evolm.task.base import Task

LOCAL_ENGINE = "evolm.engine.local.LocalEngine"


def compose_run(overrides: Sequence[str]) -> DictConfig:
    """evolm's config for ``overrides``, as ``python -m evolm`` composes it (a misspelt key or
    option is a ConfigError naming it)."""
    check_command_line(list(overrides), CONF_DIR)
    with initialize_config_dir(config_dir=CONF_DIR):
        cfg = compose("config", overrides=list(overrides))
    check_run_keys(cfg)
    return cfg


@dataclass(frozen=True)
class SharedParts:
    """What a baseline takes from the ES run's config: the task, the extra eval tasks, the
    model folder, the LoRA layout and a factory of evolm's in-process engine (``server``)."""

    task: Task
    extra_evals: dict[str, Task]
    model_path: str
    layout: LoraLayout
    make_engine: Callable[[], Engine]
    config: DictConfig


def build_shared(cfg: DictConfig) -> SharedParts:
    """Build the shared parts; cheap ones first, so bad input fails before the model resolves."""
    build = Builder(tuple(cfg.trusted_targets))
    task = build_task(build, "task", cfg.task)
    extra = {k: build_task(build, f"extra_evals.{k}", t) for k, t in cfg.extra_evals.items()}
    if cfg.server.get("_target_") != LOCAL_ENGINE:
        raise ConfigError(
            "server",
            f"the baseline evaluates with evolm's in-process engine, not {cfg.server._target_}",
            "use server=local (the ES run may use another server for training)",
        )
    server = checked_engine(build_server(build, cfg.server))
    lora_spec = build("lora", cfg.lora)
    model_path = local_model_dir(resolve_model_path(build("model", cfg.model)))
    layout = load_layout(model_path, lora_spec)
    engine = functools.partial(_engine, build, server, model_path, layout)
    return SharedParts(task, extra, model_path, layout, engine, cfg)


def _engine(build: Builder, node: Any, model_path: str, layout: LoraLayout) -> Engine:
    return build("server", node, model_path=model_path, layout=layout)
