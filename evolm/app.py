"""The composition root: the only code that reads the config.

``train(cfg)`` instantiates every group (cheap objects first, so bad input fails before any
model loads), wires them into an :class:`~evolm.loop.ESLoop` (plus the callback that writes the
final mean adapter), runs it and returns the metric a sweeper optimises. With ``resume=<run
dir>`` it continues that run from its latest valid checkpoint (:mod:`evolm.checkpoint`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from transformers import AutoConfig

from evolm.checkpoint import CHECKPOINT_DIR, Checkpoint, latest_checkpoint
from evolm.errors import ConfigError
from evolm.es import ES, ESState
from evolm.loop import Callback, ESLoop, RunContext, Stateful
from evolm.lora import LoraLayout, LoraSpec, es_scales, uniform_scales, weight_mean_scales
from evolm.server import pool
from evolm.task.base import Task
from evolm.tracking.callbacks import AdapterWriter

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
        except hydra.errors.InstantiationException as e:
            raise self._explain(group, node, e) from None

    def _explain(self, group: str, node: Any, e: Exception) -> Exception:
        cause = e.__cause__
        if isinstance(cause, ConfigError):
            return cause.in_group(group)
        if isinstance(cause, TypeError) and "argument" in str(cause):
            return ConfigError(
                group,
                str(cause),
                f"check {group}'s keys: `python -m evolm --cfg job --package {group}` shows them",
            )
        if "execution whitelist" in str(e):
            return ConfigError(
                f"{group}._target_",
                f"{node.get('_target_')!r} is not trusted",
                "add its package to trusted_targets, e.g. 'trusted_targets=[evolm.*,mypkg.*]'",
            )
        return e


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


def load_layout(model_path: str, spec: LoraSpec) -> LoraLayout:
    try:
        return LoraLayout.from_hf_config(AutoConfig.from_pretrained(model_path), spec)
    except ConfigError as e:
        raise e.in_group("lora") from None


def noise_scales(spec: LoraSpec, model_path: str, layout: LoraLayout) -> list[float]:
    if spec.noise_scale == "uniform":
        return uniform_scales(layout)
    if not Path(model_path).is_dir():
        from huggingface_hub import snapshot_download

        model_path = snapshot_download(model_path, allow_patterns=["*.json", "*.safetensors"])
    return weight_mean_scales(model_path, layout)


def resumed_config(cfg: DictConfig) -> DictConfig:
    """The resolved ``config.yaml`` of the run ``cfg.resume``, which continues exactly as it was
    configured: other command-line overrides are rejected (they would change the run)."""
    run_dir = Path(cfg.resume).expanduser()
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise ConfigError(
            "resume",
            f"{str(path)!r} does not exist",
            "point resume at a run directory, e.g. resume=outputs/runs/2026-11-21/07-15-13",
        )
    task_overrides = HydraConfig.get().overrides.task if HydraConfig.initialized() else []
    others = [o for o in task_overrides if o.lstrip("+~").split("=", 1)[0] != "resume"]
    if others:
        raise ConfigError(
            "resume",
            f"{others} would change the run being resumed (it continues as {path} says)",
            f"drop them: python -m evolm resume={cfg.resume}, or start a new run with them",
        )
    resumed = OmegaConf.load(path)
    resumed.output_dir = str(run_dir.resolve())  # the run continues where it is now
    return resumed  # type: ignore[return-value]


@dataclass(frozen=True)
class Parts:
    """The cheap objects of a run, built (and so checked) before any model loads."""

    task: Any
    model_spec: Any
    lora_spec: LoraSpec
    strategy: ES
    make_engine: Any
    callbacks: dict[str, Callback]  # "callbacks.<name>", then "logger.<name>"

    @property
    def stateful(self) -> dict[str, Stateful]:
        """What a checkpoint carries state of: the task and callbacks with ``state_dict()``."""
        parts = {"task": self.task, **self.callbacks}
        return {k: v for k, v in parts.items() if isinstance(v, Stateful)}


def build_parts(build: Builder, cfg: DictConfig) -> Parts:
    named = {f"callbacks.{k}": build("callbacks", c) for k, c in cfg.callbacks.items()}
    named |= {f"logger.{k}": build("logger", c) for k, c in cfg.logger.items()}
    task = build("task", cfg.task)
    if not isinstance(task, Task):
        raise ConfigError(
            "task._target_",
            f"{type(task).__qualname__} is not an evolm.task.Task",
            "subclass evolm.task.Task (its optional hooks have defaults; docs/tasks.md)",
        )
    return Parts(
        task=task,
        model_spec=build("model", cfg.model),
        lora_spec=build("lora", cfg.lora),
        strategy=build("es", cfg.es),
        make_engine=build("server", cfg.server),
        callbacks=named,
    )


def restore(run_dir: Path, stateful: dict[str, Stateful]) -> Checkpoint | None:
    """The run's latest valid checkpoint, with its task and callback state loaded into
    ``stateful``; None (start again from generation 0) when there is none."""
    checkpoint = latest_checkpoint(run_dir / CHECKPOINT_DIR)
    if checkpoint is None:
        log.warning("%s holds no usable checkpoint: the run starts again at generation 0", run_dir)
        return None
    for name, state in checkpoint.state.items():
        if name in stateful:
            stateful[name].load_state_dict(state)
        else:
            log.warning("checkpoint state of %r ignored: this run has no such part", name)
    log.info(
        "resuming %s at generation %d (%s)", run_dir, checkpoint.generation, checkpoint.path.name
    )
    return checkpoint


def make_loop(cfg: DictConfig, parts: Parts, engine: Any, layout: LoraLayout) -> ESLoop:
    log.info(
        "ES over %d LoRA parameters (%d targets, rank %d), population %d, %d generations",
        layout.numel(),
        len(layout.targets),
        layout.rank,
        parts.strategy.population_size,
        cfg.generations,
    )
    return ESLoop(
        strategy=parts.strategy,
        task=parts.task,
        engine=engine,
        layout=layout,
        generations=cfg.generations,
        eval_every=cfg.eval_every,
        seed=cfg.seed,
        callbacks=[AdapterWriter(), *parts.callbacks.values()],  # adapter first: loggers upload it
    )


def train(cfg: DictConfig) -> float:
    """Run one ES fine-tuning job described by ``cfg``, or continue the run ``cfg.resume``
    from its latest valid checkpoint; returns ``cfg.optimized_metric``."""
    resuming = cfg.resume is not None
    if resuming:
        cfg = resumed_config(cfg)
    check_run_keys(cfg)
    build = Builder(tuple(cfg.trusted_targets))
    parts = build_parts(build, cfg)
    lora_spec, strategy, make_engine = parts.lora_spec, parts.strategy, parts.make_engine
    stateful = parts.stateful
    output_dir = Path(cfg.output_dir)
    checkpoint = restore(output_dir, stateful) if resuming else None

    model_path = parts.model_spec.resolve()
    layout = load_layout(model_path, lora_spec)
    scales = noise_scales(lora_spec, model_path, layout)
    engine = pool.open_engine(  # a multirun's trials share one engine (evolm.server.pool)
        model_path,
        OmegaConf.to_container(cfg.server, resolve=True),  # type: ignore[arg-type]
        layout,
        lambda: build("server", make_engine, model_path=model_path, layout=layout),
    )

    output_dir.mkdir(parents=True, exist_ok=True)
    if not resuming:
        (output_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    ctx = RunContext(
        output_dir=output_dir,
        generations=cfg.generations,
        layout=layout,
        base_model=model_path,
        config=OmegaConf.to_container(cfg, resolve=True),  # type: ignore[arg-type]
        history=checkpoint.records if checkpoint else [],
        stateful=stateful,
    )
    state = (
        ESState.from_state_dict(checkpoint.es)
        if checkpoint is not None
        else strategy.init(
            initial_mean(layout, lora_spec, scales, cfg.seed),
            cfg.seed,
            es_scales(lora_spec, scales),  # es.sigma in lora.sigma_units
        )
    )
    loop = make_loop(cfg, parts, engine, layout)
    try:
        state, summary = loop.run(state, ctx)
    finally:
        pool.release(engine)
    return metric(summary, cfg.optimized_metric)


def initial_mean(
    layout: LoraLayout, spec: LoraSpec, scales: list[float], seed: int
) -> list[torch.Tensor]:
    """The initial ES mean, on the GPU when there is one: noise is then drawn where it is used
    (the CPU and CUDA generators differ, so a GPU run's noise differs from a CPU run's)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return [m.to(device) for m in layout.init_mean(spec, scales, seed)]


def metric(summary: dict[str, Any], name: str) -> float:
    if name not in summary:
        raise ConfigError(
            "optimized_metric",
            f"{name!r} is not among the run's final metrics {sorted(summary)}",
            "name one of them, e.g. eval/reward_mean",
        )
    value = float(summary[name])
    if not math.isfinite(value):
        raise RuntimeError(f"{name} is {value}: the run diverged")
    return value
