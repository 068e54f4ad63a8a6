"""Structured-config schemas, registered in Hydra's ConfigStore.

Each YAML option in ``conf/<group>/`` lists its schema first in its defaults list, so unknown
keys and wrong types fail when Hydra composes the config, before anything is built. The schemas
are generated from the constructors' signatures (hydra-zen), so a class and its config cannot
drift apart: a config node's keys are exactly its ``_target_``'s arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra_zen import builds
from omegaconf import MISSING

from evolm.es import ES
from evolm.lora.spec import LoraSpec
from evolm.model import HubModel, TinyModel
from evolm.server.local import LocalEngine
from evolm.task.conciseness import Conciseness
from evolm.task.countdown import Countdown
from evolm.task.scorer import Scorer


def schema(target: type, **kwargs: Any) -> Any:
    return builds(target, populate_full_signature=True, **kwargs)


SCHEMAS: dict[tuple[str, str], Any] = {
    ("task", "schema_conciseness"): schema(Conciseness),
    ("task", "schema_countdown"): schema(Countdown),
    ("task", "schema_scorer"): schema(Scorer),
    ("model", "schema_tiny"): schema(TinyModel),
    ("model", "schema_hub"): schema(HubModel),
    ("lora", "schema_lora"): schema(LoraSpec),
    ("es", "schema_es"): schema(ES),
    # Arguments known only at run time are completed by the composition root.
    ("server", "schema_local"): schema(
        LocalEngine, zen_partial=True, zen_exclude=("model_path", "layout")
    ),
}


@dataclass
class Config:
    """The root config: one node per group plus run-wide keys."""

    task: Any = MISSING
    model: Any = MISSING
    lora: Any = MISSING
    es: Any = MISSING
    server: Any = MISSING
    logger: dict[str, Any] = field(default_factory=dict)
    callbacks: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    generations: int = 50
    eval_every: int = 10
    output_dir: str = MISSING
    optimized_metric: str = "eval/reward_mean"
    tags: list[str] = field(default_factory=list)
    trusted_targets: list[str] = field(default_factory=lambda: ["evolm.*"])


def register() -> None:
    """Register the schemas (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    for (group, name), node in SCHEMAS.items():
        cs.store(group=group, name=name, node=node)


register()
