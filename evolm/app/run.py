"""One ES job from its config: :func:`train`, read top to bottom, is the whole run."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from evolm import dist
from evolm.app import pool
from evolm.app.build import (
    Builder,
    Parts,
    base_weight_norm,
    build_parts,
    load_layout,
    noise_scales,
    resolve_model,
)
from evolm.app.checks import check_full_mode, check_run_keys, preflight
from evolm.app.modes import Mode, make_mode
from evolm.app.resume import data_files, extending, restore, resumed_config
from evolm.callbacks import Callback, RunContext
from evolm.checkpoint import Checkpoint, atomic_write, check_shapes, run_identity
from evolm.errors import ConfigError
from evolm.es import ESState
from evolm.loop import ESLoop
from evolm.preflight import agreement, limits, trust

log = logging.getLogger(__name__)


def train(cfg: DictConfig) -> float | list[float]:
    """Run one ES fine-tuning job described by ``cfg``, or continue the run ``cfg.resume``
    from its latest valid checkpoint; returns ``cfg.optimized_metric`` (a list of values for a
    list of names). Everything that can fail on bad input fails before the model loads."""
    comm = dist.current()  # joined by evolm.__main__ under torchrun/SLURM; else one process
    job = prepare(cfg, comm)
    cfg, parts = job.cfg, job.parts
    model_path = resolve_model(parts.model_spec)
    layout = load_layout(model_path, parts.lora_spec)
    # the model's context: the task's prompts and every extra eval's
    limits.check_prompts_fit(model_path, parts.task, cfg.generations, parts.extra_evals)
    limits.check_population_memory(layout.numel(), parts.strategy.population_size)
    mode = make_mode(parts.strategy, layout, parts.lora_spec, model_path)
    if job.checkpoint is not None:
        check_shapes(job.checkpoint, mode.mean_shapes())
    scales = noise_scales(parts.lora_spec, mode.model_path, layout)
    engine = pool.open_engine(  # a multirun's trials share one engine (evolm.app.pool)
        mode.model_path,
        OmegaConf.to_container(cfg.server, resolve=True),  # type: ignore[arg-type]
        layout,
        lambda: job.build("server", parts.make_engine, model_path=mode.model_path, layout=layout),
    )
    try:
        ctx = job.context(mode.model_path, layout, comm)
        saved = job.checkpoint
        restored = ESState.from_state_dict(saved.es) if saved is not None else None
        state = mode.start(engine, restored, cfg.seed, scales, comm)
        base_norm = base_weight_norm(mode.model_path, layout)
        _, summary = make_loop(cfg, parts, mode, engine, comm, base_norm).run(state, ctx)
    finally:
        mode.close(engine, pool.in_multirun())
        pool.release(engine)
    return metric(summary, cfg.optimized_metric)


@dataclass(frozen=True)
class Job:
    """A run's checked config, its parts and what a resume found, before any model loads."""

    cfg: DictConfig
    build: Builder
    parts: Parts
    config: dict[str, Any]  # cfg resolved, as config.yaml and the checkpoint's identity
    resuming: bool
    checkpoint: Checkpoint | None
    data: dict[str, Any]  # the data files' fingerprints
    changes: list[str]  # what a resume on other data found changed (resume_on_new_data)
    extended: bool = False  # a resume changed when the run stops or evaluates (EXTENDABLE)

    def context(self, model_path: str, layout: Any, comm: dist.Comm) -> RunContext:
        """The run directory made (its config.yaml written by a new run's rank 0) and the
        context every callback sees."""
        output_dir = Path(self.cfg.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        if comm.is_main and (not self.resuming or self.extended):
            text = OmegaConf.to_yaml(self.cfg, resolve=True)
            atomic_write(output_dir / "config.yaml", text.encode())
        return RunContext(
            output_dir=output_dir,
            generations=self.cfg.generations,
            layout=layout,
            base_model=model_path,
            config=self.config,
            history=self.checkpoint.records if self.checkpoint else [],
            resumed=self.resuming,
            stateful=self.parts.stateful,
            tags=agreement.changes_tag(self.changes),
            data=self.data,
            data_changes=self.changes,
        )


def prepare(cfg: DictConfig, comm: dist.Comm) -> Job:
    """The config checked (a resume's own, its targets trusted as the command line says), the
    parts built, every rank agreeing on config and data, the checkpoint restored, and the
    services the tasks need answering."""
    resuming = cfg.resume is not None
    accept_new_data = bool(cfg.resume_on_new_data)  # the command line's, not config.yaml's
    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else None
    trusted = trust.job_trusted(cfg, overrides)
    if resuming:
        cfg = resumed_config(cfg, trusted, comm)
    else:
        trust.check_config_targets(cfg, trusted, "the config files and command line")
    check_run_keys(cfg)
    check_full_mode(cfg)
    build = Builder(trusted)
    parts = build_parts(build, cfg)
    config: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    run_wide = {k: cfg[k] for k in ("generations", "eval_every", "time_budget_s", "eval_every_s")}
    run_wide["eval_start"] = cfg.get("eval_start", True)  # a config.yaml older than the key
    run_wide["train_mean"] = cfg.get("train_mean", True)  # (as this one)
    data = agreement.data_fingerprints(parts.task, cfg.generations, parts.extra_evals)
    agreed = run_identity(config) | run_identity(config, ("extra_evals",)) | run_wide
    agreement.check_ranks_agree(comm, agreed, data)
    checkpoint = (
        restore(Path(cfg.output_dir), parts.stateful, run_identity(config), comm)
        if resuming
        else None
    )
    changes = (
        agreement.check_resumed_data(checkpoint, data, data_files(config), accept_new_data)
        if checkpoint is not None
        else []
    )
    preflight(parts.task)  # a service the task needs (the scorer) answers: before the model
    for name, extra in parts.extra_evals.items():
        preflight(extra, f"extra_evals.{name}")
    extended = resuming and bool(extending(overrides))
    return Job(cfg, build, parts, config, resuming, checkpoint, data, changes, extended)


def make_loop(
    cfg: DictConfig,
    parts: Parts,
    mode: Mode,
    engine: Any,
    comm: dist.Comm = dist.SINGLE,
    base_norm: float | None = None,
) -> ESLoop:
    log.info("%s", mode.describe(cfg.generations))
    return ESLoop(
        strategy=mode.strategy,
        task=parts.task,
        engine=engine,
        layout=mode.layout,
        generations=cfg.generations,
        eval_every=cfg.eval_every,
        eval_start=cfg.get("eval_start", True),
        train_mean=cfg.get("train_mean", True),  # a config.yaml older than the key: on
        seed=cfg.seed,
        time_budget_s=cfg.time_budget_s,
        eval_every_s=cfg.eval_every_s,
        callbacks=run_callbacks(parts, comm, mode.writer(cfg.get("keep_best"))),
        comm=comm,
        base_norm=base_norm,
        extra_evals=parts.extra_evals,
    )


def run_callbacks(parts: Parts, comm: dist.Comm, writer: Callback) -> list[Callback]:
    """The final mean's writer (first: loggers upload what it writes) and the configured
    callbacks; on ranks other than 0 only the callbacks marked ``every_rank`` (nothing that
    writes)."""
    if comm.is_main:
        return [writer, *parts.callbacks.values()]
    return [cb for cb in parts.callbacks.values() if cb.every_rank]


def metric(summary: dict[str, Any], name: str | Sequence[str]) -> float | list[float]:
    """``summary[name]``, finite; for a list of names (a multi-objective sweep: es_pareto),
    their values in that order."""
    if not isinstance(name, str):
        return [metric_value(summary, n) for n in name]
    return metric_value(summary, name)


def metric_value(summary: dict[str, Any], name: str) -> float:
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
