"""Building a run's parts from its config: the groups instantiated (cheap objects first, so bad
input fails before any model loads), the model resolved and its LoRA layout read."""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf
from transformers import AutoConfig

from evolm.callbacks import Callback, Stateful
from evolm.errors import ConfigError
from evolm.es import ES
from evolm.lora import LoraLayout, LoraSpec, uniform_scales, weight_mean_scales
from evolm.lora.norms import READ_ERRORS, weight_norm
from evolm.model.tiny import TinyModel
from evolm.preflight.compose_check import closest
from evolm.task.base import Task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Builder:
    """Instantiates config nodes whose ``_target_`` matches ``trusted`` (Hydra's execution
    whitelist); a ConfigError from a constructor comes out as ``group.key``."""

    trusted: tuple[str, ...]

    def __call__(self, group: str, node: Any, **kwargs: Any) -> Any:
        try:
            if callable(node):  # a partial from `_partial_: true`, completed here
                return node(**kwargs)
            return hydra.utils.instantiate(node, _execution_whitelist_=list(self.trusted), **kwargs)
        except ConfigError as e:
            raise e.in_group(group) from None
        except TypeError as e:  # `+es.sigm=0.1`: an argument the constructor does not take
            if not re.search(r"unexpected keyword argument|missing \d+ required", str(e)):
                raise
            raise self._explain(group, node, hydra.errors.InstantiationException(e)) from None
        except hydra.errors.InstantiationException as e:
            raise self._explain(group, node, e) from None

    def _explain(self, group: str, node: Any, e: Exception) -> Exception:
        cause = e.__cause__ or (e.args[0] if e.args else None)
        if isinstance(cause, ConfigError):
            return cause.in_group(group)
        if isinstance(cause, TypeError) and "argument" in str(cause):
            return self._bad_argument(group, node, cause)
        if "execution whitelist" in str(e):
            return ConfigError(
                f"{group}._target_",
                f"{node.get('_target_')!r} is not trusted",
                "add its package to trusted_targets, e.g. 'trusted_targets=[evolm.*,mypkg.*]'",
            )
        return e

    @staticmethod
    def _bad_argument(group: str, node: Any, cause: TypeError) -> ConfigError:
        """``+es.sigmaa=0.1``: the key as written and, for an unknown one, the closest keys."""
        named = re.search(r"argument '(\w+)'", str(cause))
        listing = f"`python -m evolm --cfg job --package {group}` shows them"
        if named is None:
            return ConfigError(group, str(cause), f"check {group}'s keys: {listing}")
        name = named.group(1)
        near = (
            closest(name, [str(k) for k in node if k != name]) if "unexpected" in str(cause) else []
        )
        fix = (
            f"did you mean {' or '.join(f'{group}.{k}' for k in near)}? ({listing})"
            if near
            else f"check {group}'s keys: {listing}"
        )
        return ConfigError(f"{group}.{name}", str(cause), fix)


@dataclass(frozen=True)
class Parts:
    """The cheap objects of a run, built (and so checked) before any model loads."""

    task: Any
    model_spec: Any
    lora_spec: LoraSpec
    strategy: ES  # the hyperparameters; evolm.app.modes makes the run's strategy of them
    make_engine: Any
    callbacks: dict[str, Callback]  # "callbacks.<name>", then "logger.<name>"
    extra_evals: dict[str, Task]  # also scored at every eval of the mean (forgetting check)

    @property
    def stateful(self) -> dict[str, Stateful]:
        """What a checkpoint carries state of: the task and callbacks with ``state_dict()``."""
        parts = {"task": self.task, **self.callbacks}
        return {k: v for k, v in parts.items() if isinstance(v, Stateful)}


def build_parts(build: Builder, cfg: DictConfig) -> Parts:
    named = {f"callbacks.{k}": build(f"callbacks.{k}", c) for k, c in cfg.callbacks.items()}
    named |= {f"logger.{k}": build(f"logger.{k}", c) for k, c in cfg.logger.items()}
    task = build_task(build, "task", cfg.task)
    extra = {k: build_task(build, f"extra_evals.{k}", t) for k, t in cfg.extra_evals.items()}
    make_engine = checked_engine(build_server(build, cfg.server))  # before the model is looked for
    return Parts(
        task=task,
        model_spec=build("model", cfg.model),
        lora_spec=build("lora", cfg.lora),
        strategy=build("es", cfg.es),
        make_engine=make_engine,
        callbacks=named,
        extra_evals=extra,
    )


def build_server(build: Builder, node: DictConfig) -> Any:
    """The engine factory the ``server`` group names (completed with the model path and layout
    once the model is resolved). A server client's connection keys (``server.url``,
    ``server.retries``, ...: :data:`~evolm.server.options.OPTION_KEYS`) become one
    :class:`~evolm.server.options.RemoteOptions`."""
    if "launch_module" not in node:  # the in-process engine
        return build("server", node)
    from evolm.server.options import OPTION_KEYS, RemoteOptions

    plain = OmegaConf.to_container(node, resolve=True)
    assert isinstance(plain, dict)
    options = {k: plain.pop(k) for k in OPTION_KEYS if k in plain}
    try:
        remote = RemoteOptions(**options)
    except ConfigError as e:
        raise e.in_group("server") from None
    return functools.partial(build("server", OmegaConf.create(plain)), options=remote)


def checked_engine(make_engine: Any) -> Any:
    """The engine's partial, its settings checked now where the engine can check them without
    loading anything (``LocalEngine.check_settings``): before any model loads."""
    check = getattr(getattr(make_engine, "func", None), "check_settings", None)
    if check is not None:
        try:
            check(**make_engine.keywords)
        except ConfigError as e:
            raise e.in_group("server") from None
    return make_engine


def build_task(build: Builder, group: str, node: Any) -> Task:
    task = build(group, node)
    if not isinstance(task, Task):
        raise ConfigError(
            f"{group}._target_",
            f"{type(task).__qualname__} is not an evolm.task.Task",
            "subclass evolm.task.Task (its optional hooks have defaults; docs/tasks.md)",
        )
    return task


def resolve_model(spec: Any) -> str:
    """The model's path (a hub model must be on disk or downloadable: else a ConfigError). A
    tiny model with a countdown warm-up gets its data from the task package here:
    ``evolm.model`` is a leaf that imports no task."""
    try:
        if isinstance(spec, TinyModel) and spec.countdown_share:
            from evolm.task.countdown.warmup import CountdownWarmup

            return str(spec.resolve(warmup=CountdownWarmup()))
        return str(spec.resolve())
    except ConfigError as e:
        raise e.in_group("model") from None


def load_layout(model_path: str, spec: LoraSpec) -> LoraLayout:
    try:
        return LoraLayout.from_hf_config(AutoConfig.from_pretrained(model_path), spec)
    except ConfigError as e:
        raise e.in_group("lora") from None


def local_model_dir(model_path: str) -> str:
    """The model's directory (a hub id: its snapshot's config and safetensors files)."""
    if Path(model_path).is_dir():
        return model_path
    from huggingface_hub import snapshot_download

    return snapshot_download(model_path, allow_patterns=["*.json", "*.safetensors"])


def noise_scales(spec: LoraSpec, model_path: str, layout: LoraLayout) -> list[float]:
    if spec.noise_scale == "uniform":
        return uniform_scales(layout)
    return weight_mean_scales(local_model_dir(model_path), layout)


def base_weight_norm(model_path: str, layout: LoraLayout) -> float | None:
    """The norm of the adapted base weights (es/update_rel, es/mean_rel are relative to it);
    None, with a warning, where the model's safetensors files cannot be read."""
    try:
        return weight_norm(local_model_dir(model_path), layout)
    except READ_ERRORS as e:
        log.warning("es/update_rel and es/mean_rel are off: %s's weights: %s", model_path, e)
        return None
