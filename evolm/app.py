"""The composition root: the only code that reads the config.

``train(cfg)`` instantiates every group (cheap objects first, so bad input fails before any
model loads), wires them into an :class:`~evolm.loop.ESLoop` (plus the callback that writes the
final mean adapter), runs it and returns the metric a sweeper optimises. With ``resume=<run
dir>`` it continues that run from its latest valid checkpoint (:mod:`evolm.checkpoint`).
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from transformers import AutoConfig

from evolm import agreement, dist, limits, trust
from evolm.callbacks import Callback, RunContext, Stateful
from evolm.callbacks.adapter import AdapterWriter
from evolm.callbacks.model import ModelWriter
from evolm.checkpoint import (
    CHECKPOINT_DIR,
    Checkpoint,
    check_identity,
    check_shapes,
    latest_checkpoint,
    run_identity,
)
from evolm.compose_check import closest
from evolm.config import Config
from evolm.engine import pool
from evolm.errors import ConfigError
from evolm.es import ES, ESState
from evolm.es.lowrank import FullES
from evolm.loop import ESLoop
from evolm.lora import LoraLayout, LoraSpec, es_scales, uniform_scales, weight_mean_scales
from evolm.lora.norms import READ_ERRORS, target_weights, weight_norm
from evolm.model.spec import TinyModel
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


def preflight(task: Task, group: str = "task") -> None:
    """The task's check of what it needs outside the process (``Task.preflight``)."""
    try:
        task.preflight()
    except ConfigError as e:
        raise e.in_group(group) from None


def resolve_model(spec: Any) -> str:
    """The model's path (a hub model must be on disk or downloadable: else a ConfigError). A
    tiny model with a countdown warm-up gets its data from the task package here:
    ``evolm.model`` is a leaf that imports no task."""
    try:
        if isinstance(spec, TinyModel) and spec.countdown_share:
            from evolm.task.countdown_warmup import CountdownWarmup

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


def resumed_config(
    cfg: DictConfig, trusted: tuple[str, ...] = trust.DEFAULT, comm: dist.Comm = dist.SINGLE
) -> DictConfig:
    """The resolved ``config.yaml`` of the run ``cfg.resume``, which continues exactly as it was
    configured: other command-line overrides (but ``trusted_targets``) are rejected (they would
    change the run). The file is data: its ``_target_`` s must be in ``trusted`` (the command
    line's trust list, not the file's). In a process group rank 0 reads it and sends it to the
    others (their nodes need not see it)."""
    run_dir = Path(cfg.resume).expanduser()
    path = run_dir / "config.yaml"
    text = comm.broadcast(
        path.read_text(errors="replace") if comm.is_main and path.is_file() else None
    )
    if text is None:
        raise ConfigError(
            "resume",
            f"{str(path)!r} does not exist",
            "point resume at a run directory, e.g. resume=outputs/runs/2026-11-21/07-15-13",
        )
    task_overrides = HydraConfig.get().overrides.task if HydraConfig.initialized() else []
    keep = ("resume", trust.KEY, "resume_on_new_data")
    others = [o for o in task_overrides if o.lstrip("+~").split("=", 1)[0] not in keep]
    if others:
        raise ConfigError(
            "resume",
            f"{others} would change the run being resumed (it continues as {path} says)",
            f"drop them: python -m evolm resume={cfg.resume}, or start a new run with them",
        )
    resumed = load_run_config(path, text)
    resumed.output_dir = str(run_dir.resolve())  # the run continues where it is now
    resumed.trusted_targets = list(trusted)
    for key in trust.rename_moved(resumed):  # written before the callbacks moved: same classes
        log.info(
            "%s: %s names a moved _target_, read as %s", path, key, OmegaConf.select(resumed, key)
        )
    trust.check_config_targets(resumed, trusted, str(path))
    return resumed


def load_run_config(path: Path, text: str | None = None) -> DictConfig:
    """A run's ``config.yaml`` (its ``text`` when already read), checked against the root
    schema, or ConfigError naming it."""
    fix = "resume a run directory written by evolm, or restore its config.yaml from a copy"
    try:
        loaded = OmegaConf.create(path.read_text(errors="replace") if text is None else text)
    except Exception as e:  # YAML syntax, bad encoding
        problem = f"{path} is not valid YAML ({str(e).splitlines()[0]})"
        raise ConfigError("resume", problem, fix) from None
    groups = ("task", "model", "lora", "es", "server")
    missing = [g for g in groups if isinstance(loaded, DictConfig) and g not in loaded]
    if not isinstance(loaded, DictConfig) or missing:
        what = f"lacks {missing}" if isinstance(loaded, DictConfig) else "is empty or not a map"
        raise ConfigError("resume", f"{path} {what}: it is not an evolm run config", fix)
    try:
        OmegaConf.merge(OmegaConf.structured(Config), loaded)
    except Exception as e:  # unknown root key, wrong type
        raise ConfigError("resume", f"{path}: {str(e).splitlines()[0]}", fix) from None
    return loaded


@dataclass(frozen=True)
class Parts:
    """The cheap objects of a run, built (and so checked) before any model loads."""

    task: Any
    model_spec: Any
    lora_spec: LoraSpec
    strategy: ES | FullES  # built as ES; FullES once the layout is known (es.mean=full)
    make_engine: Any
    callbacks: dict[str, Callback]  # "callbacks.<name>", then "logger.<name>"
    extra_evals: dict[str, Task]  # also scored at every eval of the mean (forgetting check)

    @property
    def stateful(self) -> dict[str, Stateful]:
        """What a checkpoint carries state of: the task and callbacks with ``state_dict()``."""
        parts = {"task": self.task, **self.callbacks}
        return {k: v for k, v in parts.items() if isinstance(v, Stateful)}


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


def data_files(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The data file keys set for each part that reads data (``task``, ``extra_evals.<name>``),
    as ``{"task": {"task.data_file": "x.json"}}``: what a data error names."""
    nodes = {"task": config["task"]}
    nodes |= {f"extra_evals.{k}": v for k, v in (config.get("extra_evals") or {}).items()}
    return {
        part: {f"{part}.{k}": v for k, v in node.items() if k.endswith("_file") and v is not None}
        for part, node in nodes.items()
    }


def restore(
    run_dir: Path,
    stateful: dict[str, Stateful],
    identity: dict[str, Any],
    comm: dist.Comm = dist.SINGLE,
) -> Checkpoint | None:
    """The run's latest valid checkpoint, with its task and callback state loaded into
    ``stateful``; None (start again from generation 0) when there is none. A checkpoint written
    with another seed, ES, LoRA, model or task config than ``identity`` (the run's
    :func:`run_identity`) is a ConfigError. In a process group rank 0 reads it and sends it to
    every rank (any world size resumes any checkpoint)."""
    checkpoint = comm.broadcast(
        latest_checkpoint(run_dir / CHECKPOINT_DIR) if comm.is_main else None
    )
    if checkpoint is None:
        log.warning("%s holds no usable checkpoint: the run starts again at generation 0", run_dir)
        return None
    check_identity(checkpoint, identity)
    for name, state in checkpoint.state.items():
        if name in stateful:
            stateful[name].load_state_dict(state)
        else:
            log.warning("checkpoint state of %r ignored: this run has no such part", name)
    log.info(
        "resuming %s at generation %d (%s)", run_dir, checkpoint.generation, checkpoint.path.name
    )
    return checkpoint


def make_loop(
    cfg: DictConfig,
    parts: Parts,
    engine: Any,
    layout: LoraLayout,
    comm: dist.Comm = dist.SINGLE,
    base_norm: float | None = None,
    writer: Callback | None = None,
) -> ESLoop:
    if isinstance(parts.strategy, FullES):
        log.info(
            "ES over the full weights of %d modules (es.mean=full; members of rank %d), "
            "population %d, %d generations",
            len(layout.targets),
            layout.rank,
            parts.strategy.population_size,
            cfg.generations,
        )
    else:
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
        time_budget_s=cfg.time_budget_s,
        eval_every_s=cfg.eval_every_s,
        callbacks=run_callbacks(parts, comm, writer),
        comm=comm,
        base_norm=base_norm,
        extra_evals=parts.extra_evals,
    )


def run_callbacks(parts: Parts, comm: dist.Comm, writer: Callback | None = None) -> list[Callback]:
    """The final adapter writer (``writer``, default :class:`AdapterWriter`; first: loggers
    upload it) and the configured callbacks; on ranks other than 0 only the callbacks marked
    ``every_rank`` (nothing that writes)."""
    if comm.is_main:
        return [writer or AdapterWriter(), *parts.callbacks.values()]
    return [cb for cb in parts.callbacks.values() if cb.every_rank]


def train(cfg: DictConfig) -> float | list[float]:
    """Run one ES fine-tuning job described by ``cfg``, or continue the run ``cfg.resume``
    from its latest valid checkpoint; returns ``cfg.optimized_metric`` (a list of values for a
    list of names)."""
    comm = dist.current()  # joined by evolm.__main__ under torchrun/SLURM; else one process
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
    lora_spec, strategy, make_engine = parts.lora_spec, parts.strategy, parts.make_engine
    stateful = parts.stateful
    output_dir = Path(cfg.output_dir)
    config: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    run_wide = {k: cfg[k] for k in ("generations", "eval_every", "time_budget_s", "eval_every_s")}
    data = agreement.data_fingerprints(parts.task, cfg.generations, parts.extra_evals)
    agreed = run_identity(config) | run_identity(config, ("extra_evals",)) | run_wide
    agreement.check_ranks_agree(comm, agreed, data)
    checkpoint = restore(output_dir, stateful, run_identity(config), comm) if resuming else None
    changes = (
        agreement.check_resumed_data(checkpoint, data, data_files(config), accept_new_data)
        if checkpoint is not None
        else []
    )

    preflight(parts.task)  # a service the task needs (the scorer) answers: before the model
    for name, extra in parts.extra_evals.items():
        preflight(extra, f"extra_evals.{name}")
    model_path = resolve_model(parts.model_spec)
    layout = load_layout(model_path, lora_spec)
    # the model's context: the task's prompts and every extra eval's
    limits.check_prompts_fit(model_path, parts.task, cfg.generations, parts.extra_evals)
    limits.check_population_memory(layout.numel(), strategy.population_size)
    full = strategy.mean == "full"
    if full:
        strategy = full_strategy(strategy, layout)
        # the folder, not a hub id: every engine (SGLang too) reloads its weights from files
        model_path = local_model_dir(model_path)
    if checkpoint is not None:
        check_shapes(checkpoint, full_shapes(layout) if full else layout.shapes())
    scales = noise_scales(lora_spec, model_path, layout)
    engine = pool.open_engine(  # a multirun's trials share one engine (evolm.engine.pool)
        model_path,
        OmegaConf.to_container(cfg.server, resolve=True),  # type: ignore[arg-type]
        layout,
        lambda: build("server", make_engine, model_path=model_path, layout=layout),
    )

    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        if not resuming and comm.is_main:
            (output_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        ctx = RunContext(
            output_dir=output_dir,
            generations=cfg.generations,
            layout=layout,
            base_model=model_path,
            config=config,
            history=checkpoint.records if checkpoint else [],
            resumed=resuming,
            stateful=stateful,
            tags=agreement.changes_tag(changes),
            data=data,
            data_changes=changes,
        )
        if isinstance(strategy, FullES):
            dtype = getattr(engine, "dtype", None)  # the local engine's: members cast once to it
            if isinstance(dtype, torch.dtype) and dtype != torch.float32:
                strategy = replace(strategy, member_dtype=dtype)
            state = (
                master_on_device(on_device(ESState.from_state_dict(checkpoint.es), comm), comm)
                if checkpoint is not None
                else strategy.init(
                    base_weights(model_path, layout, comm.device), cfg.seed, scales[::2]
                )
            )
            engine.update_base_weights(strategy.named(state))  # a resumed run's master
            writer: Callback = ModelWriter(local_model_dir(model_path), strategy.names)
        else:
            state = (
                on_device(ESState.from_state_dict(checkpoint.es), comm)
                if checkpoint is not None
                else strategy.init(
                    initial_mean(layout, lora_spec, scales, cfg.seed, comm.device),
                    cfg.seed,
                    es_scales(lora_spec, scales),  # es.sigma in lora.sigma_units
                )
            )
            writer = AdapterWriter()
        parts = replace(parts, strategy=strategy)
        loop = make_loop(
            cfg, parts, engine, layout, comm, base_weight_norm(model_path, layout), writer
        )
        state, summary = loop.run(state, ctx)
    finally:
        try:
            # the next trial of a multirun meets the base weights again (a server that outlives
            # its engine, attached or kept alive, is pointed back by the engine's close())
            if full and pool.in_multirun():
                back = getattr(engine, "restore_base_weights", None)
                if back is not None:  # a server: back to the model's folder, no copy written
                    back()
                else:
                    original = base_weights(model_path, layout, torch.device("cpu"))
                    engine.update_base_weights(dict(zip(strategy.names, original, strict=True)))
        except Exception as e:  # the run's own outcome (or error) stays what is reported
            log.warning(
                "could not put the base weights back on the engine (%s): a server that "
                "outlives this run still serves the ES mean; restart it",
                e,
            )
        finally:
            pool.release(engine)
    return metric(summary, cfg.optimized_metric)


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


def full_strategy(es: ES, layout: LoraLayout) -> FullES:
    """``es.mean=full``: ES over the adapted modules' full weights, members served as LoRA
    adapters of ``layout``'s rank (:mod:`evolm.es.lowrank`)."""
    names = tuple(f"{t.path}.weight" for t in layout.targets)
    return FullES(es, rank=layout.rank, lora_scaling=layout.scaling, names=names)


def full_shapes(layout: LoraLayout) -> list[tuple[int, int]]:
    """The shapes of ``es.mean=full``'s mean: every adapted weight, ``(out, in)``."""
    return [(t.out_features, t.in_features) for t in layout.targets]


def base_weights(model_path: str, layout: LoraLayout, device: torch.device) -> list[torch.Tensor]:
    """The adapted modules' weights as the model's files hold them (their dtype: ``FullES.init``
    makes the one fp32 master copy), on ``device``, read from the safetensors files (no model
    load)."""
    return [w.to(device) for w in target_weights(local_model_dir(model_path), layout)]


def master_on_device(state: ESState, comm: dist.Comm) -> ESState:
    """A restored full-mode state's master (and Adam moments) on this rank's device."""
    state.mean = [m.to(comm.device) for m in state.mean]
    if state.opt:
        state.opt = {**state.opt, **{k: [x.to(comm.device) for x in state.opt[k]] for k in "mv"}}
    return state


def initial_mean(
    layout: LoraLayout,
    spec: LoraSpec,
    scales: list[float],
    seed: int,
    device: torch.device | None = None,
) -> list[torch.Tensor]:
    """The initial ES mean, on the GPU when there is one (this rank's in a process group):
    noise is then drawn where it is used (the CPU and CUDA generators differ, so a GPU run's
    noise differs from a CPU run's)."""
    device = device or dist.SINGLE.device
    return [m.to(device) for m in layout.init_mean(spec, scales, seed)]


def on_device(state: ESState, comm: dist.Comm) -> ESState:
    """A restored ES state whose noise is drawn on this rank's device when the checkpoint's
    noise device is of the same kind (``cuda:0``'s checkpoint resumed on rank 3: ``cuda:3``)."""
    if comm.world_size > 1 and torch.device(state.noise_device).type == comm.device.type:
        state.noise_device = str(comm.device)
    return state


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
