"""The composition root: the only code that reads the config.

``train(cfg)`` instantiates every group (cheap objects first, so bad input fails before any
model loads), wires them into an :class:`~evolm.loop.ESLoop`, runs it, writes the final mean
adapter and returns the metric a sweeper optimises.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf
from transformers import AutoConfig

from evolm.errors import ConfigError
from evolm.es import ES
from evolm.loop import Callback, ESLoop, RunContext
from evolm.lora import LoraLayout, LoraSpec, save_adapter, uniform_scales, weight_mean_scales

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


def noise_scales(spec: LoraSpec, model_path: str, layout: LoraLayout) -> list[float]:
    if spec.noise_scale == "uniform":
        return uniform_scales(layout)
    if not Path(model_path).is_dir():
        from huggingface_hub import snapshot_download

        model_path = snapshot_download(model_path, allow_patterns=["*.json", "*.safetensors"])
    return weight_mean_scales(model_path, layout)


def train(cfg: DictConfig) -> float:
    """Run one ES fine-tuning job described by ``cfg``; returns ``cfg.optimized_metric``."""
    check_run_keys(cfg)
    build = Builder(tuple(cfg.trusted_targets))
    task = build("task", cfg.task)
    model_spec = build("model", cfg.model)
    lora_spec: LoraSpec = build("lora", cfg.lora)
    strategy: ES = build("es", cfg.es)
    make_engine = build("server", cfg.server)
    callbacks: list[Callback] = [build("callbacks", c) for c in cfg.callbacks.values()]
    callbacks += [build("logger", c) for c in cfg.logger.values()]

    model_path = model_spec.resolve()
    try:
        layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(model_path), lora_spec)
    except ConfigError as e:
        raise e.in_group("lora") from None
    scales = noise_scales(lora_spec, model_path, layout)
    engine = build("server", make_engine, model_path=model_path, layout=layout)

    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    ctx = RunContext(
        output_dir=output_dir,
        generations=cfg.generations,
        layout=layout,
        base_model=model_path,
        config=OmegaConf.to_container(cfg, resolve=True),
    )  # type: ignore[arg-type]
    state = strategy.init(
        layout.init_mean(lora_spec, scales, cfg.seed), seed=cfg.seed, scales=scales
    )
    loop = ESLoop(
        strategy=strategy,
        task=task,
        engine=engine,
        layout=layout,
        generations=cfg.generations,
        eval_every=cfg.eval_every,
        seed=cfg.seed,
        callbacks=callbacks,
    )
    log.info(
        "ES over %d LoRA parameters (%d targets, rank %d), population %d, %d generations",
        layout.numel(),
        len(layout.targets),
        layout.rank,
        strategy.population_size,
        cfg.generations,
    )
    try:
        state, summary = loop.run(state, ctx)
    finally:
        engine.close()
    save_adapter(output_dir / "adapter", layout, state.mean, base_model=model_path)
    log.info("final adapter: %s", output_dir / "adapter")
    return metric(summary, cfg.optimized_metric)


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
