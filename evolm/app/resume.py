"""``resume=<run dir>``: the run's own config (checked, trusted as the command line says) and
its latest valid checkpoint, with the task's and callbacks' state loaded."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from evolm import dist
from evolm.callbacks import Stateful
from evolm.checkpoint import CHECKPOINT_DIR, Checkpoint, check_identity, latest_checkpoint
from evolm.config import Config
from evolm.errors import ConfigError
from evolm.preflight import trust

log = logging.getLogger(__name__)

EXTENDABLE = ("time_budget_s", "eval_every", "eval_every_s", "keep_best", "train_mean")
"""Run-wide keys a resume may change: when the run stops, when it evaluates the mean, which
evaluation's mean it keeps and whether each generation also scores the mean on its training
rows (``train_mean``: a measurement, not part of the ES step), never what a generation does to
the mean (``resume=RUN time_budget_s=3600`` continues a run that stopped at its time budget).
The run's ``config.yaml`` is rewritten with them, so a later resume keeps them. A run whose
``config.yaml`` predates ``train_mean`` resumes with it on (the default)."""


def override_key(override: str) -> str:
    """The key a command-line override sets (``+a.b=1``, ``~a.b`` -> ``a.b``)."""
    return override.lstrip("+~").split("=", 1)[0]


def extending(overrides: list[str] | None) -> list[str]:
    """The :data:`EXTENDABLE` keys that the command line's ``overrides`` set."""
    keys = {override_key(o) for o in overrides or []}
    return [k for k in EXTENDABLE if k in keys]


def resumed_config(
    cfg: DictConfig, trusted: tuple[str, ...] = trust.DEFAULT, comm: dist.Comm = dist.SINGLE
) -> DictConfig:
    """The resolved ``config.yaml`` of the run ``cfg.resume``, which continues exactly as it was
    configured: other command-line overrides (but ``trusted_targets`` and :data:`EXTENDABLE`)
    are rejected (they would change the run). The file is data: its ``_target_`` s must be in
    ``trusted`` (the command line's trust list, not the file's). In a process group rank 0
    reads it and sends it to the others (their nodes need not see it)."""
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
    keep = ("resume", trust.KEY, "resume_on_new_data", *EXTENDABLE)
    others = [o for o in task_overrides if override_key(o) not in keep]
    if others:
        raise ConfigError(
            "resume",
            f"{others} would change the run being resumed (it continues as {path} says)",
            f"drop them: python -m evolm resume={cfg.resume}, or start a new run with them",
        )
    resumed = load_run_config(path, text)
    for key in extending(task_overrides):
        log.info("resume: %s %s -> %s (the command line's)", key, resumed.get(key), cfg[key])
        resumed[key] = cfg[key]
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


def data_files(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The data file keys set for each part that reads data (``task``, ``extra_evals.<name>``),
    as ``{"task": {"task.data_file": "x.json"}}``: what a data error names."""
    nodes = {"task": config["task"]}
    nodes |= {f"extra_evals.{k}": v for k, v in (config.get("extra_evals") or {}).items()}
    return {
        part: {f"{part}.{k}": v for k, v in node.items() if k.endswith("_file") and v is not None}
        for part, node in nodes.items()
    }
