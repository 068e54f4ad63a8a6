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
from hydra.core.hydra_config import HydraConfig
from hydra_zen import builds
from omegaconf import MISSING, DictConfig, OmegaConf

from evolm.engine.local import LocalEngine
from evolm.es import ES
from evolm.lora.spec import LoraSpec
from evolm.model import HubModel, TinyModel
from evolm.server.sglang import SGLangEngine
from evolm.server.vllm import VLLMEngine
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
    ("server", "schema_vllm"): schema(
        VLLMEngine, zen_partial=True, zen_exclude=("model_path", "layout")
    ),
    ("server", "schema_sglang"): schema(
        SGLangEngine, zen_partial=True, zen_exclude=("model_path", "layout")
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
    resume: str | None = None


def choice(group: str, *, _root_: DictConfig) -> str:
    """``${evolm.choice:task}``: the option chosen for a config group (``conciseness``).

    Hydra's ``runtime.choices`` in an app; for a config composed outside one (the compose API),
    the group's ``_target_`` class name, lower case.
    """
    if HydraConfig.initialized():
        chosen = HydraConfig.get().runtime.choices.get(group)
        if chosen:
            return str(chosen)
    node = _root_.get(group)
    target = node.get("_target_") if isinstance(node, DictConfig) else None
    return str(target).rsplit(".", 1)[-1].lower() if target else group


def resumed(then: Any, otherwise: Any, *, _root_: DictConfig) -> Any:
    """``${evolm.resumed:A,B}``: A when the root key ``resume`` is set, else B."""
    return then if _root_.get("resume") else otherwise


def register() -> None:
    """Register the schemas and evolm's resolvers (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    for (group, name), node in SCHEMAS.items():
        cs.store(group=group, name=name, node=node)
    OmegaConf.register_resolver("evolm.choice", choice, replace=True)
    OmegaConf.register_resolver("evolm.resumed", resumed, replace=True)


register()
