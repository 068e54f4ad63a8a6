"""The trust boundary: which ``_target_`` s a run may instantiate (docs/security.md).

A config names Python callables (``_target_``, logging factories ``()``), so whoever writes a
config could run code. evolm trusts code, and the command line of the person who runs it; it
does not trust config *files* beyond their role (a ``--config-dir`` overlay, a resumed run's
``config.yaml``): they may only name targets the trust list allows, and may not widen it.

The trust list is :data:`BUILTIN` plus the ``trusted_targets=[...]`` given on the command line
(entries ``pkg.*`` or ``pkg.mod.Name``). It is checked

* by Hydra, for everything Hydra instantiates before evolm's code runs (``hydra.callbacks``,
  the sweeper's sampler, logging-config factories): :func:`hydra_whitelist` is passed to
  ``@hydra.main(execution_whitelist=...)``;
* by evolm, for every ``_target_`` in the job's config (:func:`check_config_targets`, before
  anything is built) and again when each group is built (``evolm.app.build.Builder``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from evolm.errors import ConfigError

DEFAULT = ("evolm.*",)
"""The default of the ``trusted_targets`` key (conf/config.yaml)."""
BUILTIN = (*DEFAULT, "optuna.samplers.*", "hydra_plugins.hydra_optuna_sweeper.*")
"""Always trusted: evolm, and the Optuna samplers its sweeps' config names."""
KEY = "trusted_targets"

MOVED = {
    "evolm.tracking.callbacks.ProgressBar": "evolm.callbacks.progress.ProgressBar",
    "evolm.tracking.callbacks.ResultsWriter": "evolm.callbacks.results.ResultsWriter",
    "evolm.tracking.callbacks.EvolutionPlot": "evolm.callbacks.plot.EvolutionPlot",
    "evolm.tracking.callbacks.AdapterWriter": "evolm.callbacks.adapter.AdapterWriter",
    "evolm.tracking.samples.SampleWriter": "evolm.callbacks.samples.SampleWriter",
    "evolm.tracking.health.LearningMonitor": "evolm.callbacks.health.LearningMonitor",
    "evolm.tracking.mlflow.MLflowLogger": "evolm.callbacks.mlflow.MLflowLogger",
    "evolm.checkpoint.Checkpointer": "evolm.callbacks.checkpoint.Checkpointer",
}
"""``_target_`` s that moved (the callbacks to :mod:`evolm.callbacks`): a config naming the old
path is refused with the new one (a resumed run's ``config.yaml`` of an older evolm too)."""


def is_trusted(target: str, trusted: Sequence[str]) -> bool:
    """Whether ``target`` (``pkg.mod.Name``) matches an entry (``pkg.*`` or an exact name)."""
    for pattern in trusted:
        if pattern.endswith(".*") and target.startswith(pattern[:-1]):
            return True
        if target == pattern:
            return True
    return False


def _override_value(override: str) -> list[str] | None:
    """The list of a ``trusted_targets=[...]`` command-line override, else None."""
    key, sep, _ = override.lstrip("+~").partition("=")
    if not sep or key != KEY:
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser

    value = OverridesParser.create().parse_override(override).value()
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(KEY, f"must be a list of strings, got {value!r}", "e.g. [evolm.*,pkg.*]")
    return value


def command_line_trusted(overrides: Sequence[str]) -> tuple[str, ...]:
    """The ``trusted_targets`` the command line sets (its default when it sets none)."""
    for override in reversed(overrides):
        value = _override_value(override)
        if value is not None:
            return tuple(value)
    return DEFAULT


def hydra_whitelist(argv: Sequence[str]) -> list[str]:
    """Hydra's execution whitelist for this process: :data:`BUILTIN` plus the command line's
    ``trusted_targets`` (what ``@hydra.main`` instantiates is checked against it)."""
    overrides = [a for a in argv if not a.startswith("-")]
    return sorted({*BUILTIN, *command_line_trusted(overrides)})


def _config_dirs(argv: Sequence[str]) -> list[Path]:
    dirs = []
    for i, arg in enumerate(argv):
        for flag in ("--config-dir", "-cd"):
            if arg == flag and i + 1 < len(argv):
                dirs.append(Path(argv[i + 1]))
            elif arg.startswith(flag + "="):
                dirs.append(Path(arg.split("=", 1)[1]))
    return dirs


def _callables(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """``(key, name)`` of every ``_target_`` and logging factory ``()`` in plain YAML data."""
    if isinstance(node, dict):
        for k, v in node.items():
            key = f"{path}.{k}" if path else str(k)
            if k in ("_target_", "()") and isinstance(v, str):
                yield key, v
            else:
                yield from _callables(v, key)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _callables(v, f"{path}[{i}]")


def precheck(argv: Sequence[str], whitelist: Sequence[str]) -> None:
    """Refuse, with one message, an untrusted callable that the command line or a
    ``--config-dir`` overlay names (Hydra would refuse it too, with a traceback)."""
    found: list[tuple[str, str, str]] = []
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if sep and not arg.startswith("-") and key.rsplit(".", 1)[-1] in ("_target_", "()"):
            found.append(("the command line", key, value.strip("'\"")))
    for folder in _config_dirs(argv):
        for path in sorted(folder.rglob("*.yaml")) if folder.is_dir() else []:
            try:
                data = yaml.safe_load(path.read_text(encoding="utf-8"))
            except (yaml.YAMLError, UnicodeDecodeError, OSError):
                continue  # Hydra reports the file if the run uses it
            found += [(str(path), key, name) for key, name in _callables(data)]
    for source, key, name in found:
        if not is_trusted(name, whitelist):
            raise ConfigError(
                key,
                f"{name!r} (in {source}) is not trusted: trusted_targets is {list(whitelist)}",
                "if you trust it, add it on the command line, e.g. "
                f"'trusted_targets=[evolm.*,{name.rsplit('.', 1)[0]}.*]'",
            )


def job_trusted(cfg: DictConfig, task_overrides: Sequence[str] | None) -> tuple[str, ...]:
    """The trust list of a job: its command line's ``trusted_targets`` (``task_overrides``, the
    job's Hydra overrides; None outside a Hydra app, where the caller's ``cfg`` is trusted).

    A config file that sets ``trusted_targets`` to more than the command line gave is refused.
    """
    if task_overrides is None:
        return tuple(cfg.get(KEY) or DEFAULT)
    trusted = command_line_trusted(task_overrides)
    extra = sorted(set(cfg.get(KEY) or ()) - set(trusted))
    if extra:
        raise ConfigError(
            KEY,
            f"a config file widens it by {extra}; only the command line may",
            f"if you trust those packages, pass 'trusted_targets=[{','.join([*trusted, *extra])}]'"
            " on the command line",
        )
    return trusted


def targets(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """``(key, target)`` of every ``_target_`` under ``node`` (a config, dict or list)."""
    if isinstance(node, DictConfig | dict):
        items = node.items_ex(resolve=False) if isinstance(node, DictConfig) else node.items()
        for k, v in items:
            key = f"{path}.{k}" if path else str(k)
            if k == "_target_":
                yield key, str(v)
            else:
                yield from targets(v, key)
    elif isinstance(node, ListConfig | list):
        for i, v in enumerate(node):
            yield from targets(v, f"{path}[{i}]")


def rename_moved(cfg: DictConfig) -> list[str]:
    """Rewrite, in place, every ``_target_`` of ``cfg`` that :data:`MOVED` renames (a run's
    ``config.yaml`` written before the move; a pure rename, the same class); returns the keys
    rewritten."""
    plain = OmegaConf.to_container(cfg, resolve=False)
    renamed = []
    for key, target in targets(plain):
        if target in MOVED:
            OmegaConf.update(cfg, key, MOVED[target], merge=False)
            renamed.append(key)
    return renamed


def check_config_targets(cfg: DictConfig | dict, trusted: Sequence[str], source: str) -> None:
    """Refuse the first ``_target_`` in ``cfg`` that ``trusted`` does not allow; ``source``
    says where the config came from (the command line and config files, or a run's
    ``config.yaml``)."""
    plain = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else cfg
    for key, target in targets(plain):
        if target in MOVED:
            raise ConfigError(
                key,
                f"{target!r} (from {source}) moved to {MOVED[target]!r}",
                f"write '_target_: {MOVED[target]}' instead (in {source}, or on the command "
                f"line: '{key}={MOVED[target]}')",
            )
        if not is_trusted(target, trusted):
            raise ConfigError(
                key,
                f"{target!r} (from {source}) is not trusted: trusted_targets is {list(trusted)}",
                "if you trust it, add its package on the command line, e.g. "
                f"'trusted_targets=[{','.join([*trusted, target.rsplit('.', 1)[0] + '.*'])}]'",
            )
