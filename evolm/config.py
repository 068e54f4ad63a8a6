"""Structured-config schemas, registered in Hydra's ConfigStore, built lazily.

Each YAML option in ``conf/<group>/`` names its ``_target_`` and lists its schema first in its
defaults list (``- schema_countdown``), so unknown keys and wrong types fail when Hydra composes
the config, before anything is built. The schemas are generated from the constructors'
signatures (hydra-zen), so a class and its config cannot drift apart: a config node's keys are
exactly its ``_target_``'s arguments.

Generating a schema imports its class, and the engines and tasks import heavy libraries. So the
schemas are registered as placeholders (:class:`SchemaGroup`) and generated when Hydra first
opens one: composing a config imports only the classes that config uses. Schemas are not
choices a user picks, so they are left out of a group's listing (``--help``).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hydra.core.config_store import ConfigNode, ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import MISSING, DictConfig, OmegaConf

from evolm import metrics as M

RUNTIME_ARGS = ("model_path", "layout")  # an engine's arguments known only at run time

# group -> schema name -> (target "module:Class", completed at run time by the composition root)
SCHEMAS: dict[str, dict[str, tuple[str, bool]]] = {
    "task": {
        "schema_conciseness": ("evolm.task.conciseness:Conciseness", False),
        "schema_countdown": ("evolm.task.countdown:Countdown", False),
        "schema_scorer": ("evolm.task.scorer:Scorer", False),
    },
    "model": {
        "schema_tiny": ("evolm.model.tiny:TinyModel", False),
        "schema_hub": ("evolm.model.spec:HubModel", False),
        "schema_gguf": ("evolm.model.gguf:GGUFModel", False),
    },
    "lora": {"schema_lora": ("evolm.lora.spec:LoraSpec", False)},
    "es": {"schema_es": ("evolm.es.strategy:ES", False)},
    "server": {
        "schema_local": ("evolm.engine.local:LocalEngine", True),
        "schema_vllm": ("evolm.server.vllm:VLLMEngine", True),
        # the _target_ is sglang_servers, which passes these keys on to every server
        "schema_sglang": ("evolm.server.sglang:SGLangEngine", True),
    },
}


def target(path: str) -> type:
    """The class named by ``module:Class``."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def schema(cls: type, runtime: bool = False) -> Any:
    """The structured config of ``cls``'s constructor; ``runtime``: a partial whose
    :data:`RUNTIME_ARGS` the composition root completes."""
    from hydra_zen import builds

    if not runtime:
        return builds(cls, populate_full_signature=True)
    if "options" not in inspect.signature(cls).parameters:
        return builds(cls, populate_full_signature=True, zen_partial=True, zen_exclude=RUNTIME_ARGS)
    # a server client: RemoteOptions fields are flat server.* keys (evolm.app.build.build_server)
    from evolm.server.options import RemoteOptions

    own = builds(
        cls, populate_full_signature=True, zen_partial=True, zen_exclude=(*RUNTIME_ARGS, "options")
    )
    flat = [
        (f.name, f.type, _field_default(f))
        for f in dataclasses.fields(builds(RemoteOptions, populate_full_signature=True))
        if f.name != "_target_"
    ]
    return dataclasses.make_dataclass(own.__name__, flat, bases=(own,))


def _field_default(f: dataclasses.Field[Any]) -> Any:
    """``f``'s default as a field of a derived dataclass (a required one: OmegaConf's MISSING)."""
    if f.default is not dataclasses.MISSING:
        return dataclasses.field(default=f.default)
    if f.default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=f.default_factory)
    return dataclasses.field(default=MISSING)


class SchemaGroup(dict[str, Any]):
    """One config group's schemas in Hydra's ConfigStore, generated on first use.

    Hydra reads its repository through ``in``, ``[]`` and ``keys()`` (``ConfigStore._open`` and
    ``list``; hydra-core is pinned). Until Hydra opens an entry it is a placeholder: ``[]``
    imports the target and stores the generated schema. ``keys()`` hides the schemas, so
    ``--help`` lists only the options a user chooses from.
    """

    def __init__(self, group: str, entries: dict[str, tuple[str, bool]]) -> None:
        super().__init__({f"{name}.yaml": spec for name, spec in entries.items()})
        self.group = group

    def __getitem__(self, name: str) -> Any:
        value = super().__getitem__(name)
        if isinstance(value, tuple):
            path, runtime = value
            node = OmegaConf.structured(schema(target(path), runtime))
            value = ConfigNode(
                name=name, node=node, group=self.group, package=None, provider="evolm"
            )
            super().__setitem__(name, value)
        return value

    def keys(self) -> Any:  # type: ignore[override]
        return [k for k in self if not k.startswith("schema_")]


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
    eval_start: bool = True
    train_mean: bool = True  # the mean also scored on each generation's training rows
    time_budget_s: float | None = None
    eval_every_s: float | None = None
    keep_best: str | None = None  # a metric of the mean's evals: its best mean kept (MeanWriter)
    output_dir: str = MISSING
    optimized_metric: Any = M.EVAL_REWARD  # a name, or a list of names (multi-objective)
    tags: list[str] = field(default_factory=list)
    trusted_targets: list[str] = field(default_factory=lambda: ["evolm.*"])
    resume: str | None = None
    resume_on_new_data: bool = False
    extra_evals: dict[str, Any] = field(default_factory=dict)


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
    node_target = node.get("_target_") if isinstance(node, DictConfig) else None
    return str(node_target).rsplit(".", 1)[-1].lower() if node_target else group


def for_task(name: str, then: Any, otherwise: Any, *, _root_: DictConfig) -> Any:
    """``${evolm.for_task:countdown,800,200}``: ``then`` when the chosen task is ``name``
    (:func:`choice`), else ``otherwise`` (the tiny model's warm-up follows the task)."""
    return then if choice("task", _root_=_root_) == name else otherwise


def resumed(then: Any, otherwise: Any, *, _root_: DictConfig) -> Any:
    """``${evolm.resumed:A,B}``: A when the root key ``resume`` is set, else B."""
    return then if _root_.get("resume") else otherwise


def run_dir(resume: Any, fresh: str) -> str:
    """``${evolm.run_dir:${resume},outputs/runs/DATE/TIME}``: the run's directory.

    A resumed run's own; else ``fresh``, claimed with an atomic ``mkdir`` (``fresh``,
    ``fresh-1``, ``fresh-2``...), so two runs started in the same second never share a directory
    (and so never interleave their results.jsonl). Claimed once per process, by rank 0 in a
    process group, which tells the other ranks (:func:`evolm.cli.rundir.claim`).
    """
    if resume:
        return str(resume)
    from evolm.cli.rundir import claim

    return claim(fresh)


def now(pattern: str) -> str:
    """``${evolm.now:%H-%M-%S}``: the run's start time (rank 0's in a process group, so every
    rank of a distributed run names the same run directory) formatted with ``pattern``."""
    from evolm.dist import current

    return datetime.fromtimestamp(current().start_time).strftime(pattern)


def plus(a: Any, b: Any) -> int:
    """``${evolm.plus:${es.population_size},1}``: integer sum (adapter slots = N + 1; a
    bool counts 1: ``${evolm.plus:1,${train_mean}}``)."""
    return int(a) + int(b)


def register() -> None:
    """Register the root schema, the lazy group schemas and evolm's resolvers (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config, replace=True)
    for group, entries in SCHEMAS.items():
        existing = cs.repo.get(group)
        if not isinstance(existing, SchemaGroup):
            cs.repo[group] = SchemaGroup(group, entries)
    OmegaConf.register_resolver("evolm.choice", choice, replace=True)
    OmegaConf.register_resolver("evolm.for_task", for_task, replace=True)
    OmegaConf.register_resolver("evolm.resumed", resumed, replace=True)
    OmegaConf.register_resolver("evolm.run_dir", run_dir, replace=True)
    OmegaConf.register_resolver("evolm.now", now, replace=True, use_cache=True)
    OmegaConf.register_resolver("evolm.at_least_one", lambda n: max(1, int(n)), replace=True)
    OmegaConf.register_resolver("evolm.plus", plus, replace=True)


register()
