"""The command line composed once before Hydra runs it, so a misspelt key or an unknown option is
a :class:`~evolm.errors.ConfigError` (exit 2, one message) that names the key as the user wrote
it and the valid choices, instead of Hydra's exit 1 naming internal classes (``Builds_ES``) and
suggesting ``+es.sigmaa=...`` (which adds the misspelt key and fails later).

Composition follows ``@hydra.main`` exactly (the same search path, ``--config-dir``,
``--config-name``; a multirun's sweep overrides are left out as Hydra's own first composition
leaves them out), and costs a tenth of a second: the schemas it imports, Hydra needs anyway.

A multirun's trials are then composed as its sweeper will compose them (:func:`check_sweep`):
every sweep expression, from the command line or ``hydra.sweeper.params``, replaced by the
values it gives (a choice's or range's values, an interval's ends; one composition per
position, at most :data:`MAX_SWEEP_COMPOSITIONS`), so a misspelt key or a value of the wrong
type inside a sweep is one error before the sweep starts, not a failure of every trial.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from evolm.errors import ConfigError

MAX_SWEEP_COMPOSITIONS = 8
"""How many trial configs :func:`check_sweep` composes at most (each about 0.1 s)."""


def closest(word: str, choices: Sequence[str], n: int = 3) -> list[str]:
    """The ``choices`` closest to ``word`` (a misspelling), best first; empty if none is close."""
    return difflib.get_close_matches(word, list(choices), n=n, cutoff=0.7)


def check_command_line(argv: Sequence[str], conf_dir: str, config_name: str = "config") -> None:
    """Compose the config of a run (or a multirun) command line; a composition error becomes a
    ConfigError. Other commands (``--help``, ``--cfg``, ``--info``...) are left to Hydra."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_automatic_config_search_path, get_args_parser
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import (
        ConfigCompositionException,
        MissingConfigException,
        OverrideParseException,
    )
    from hydra.types import RunMode

    args = get_args_parser().parse_intermixed_args(list(argv))
    other = (args.help, args.hydra_help, args.cfg, args.info, args.shell_completion)
    if any(other) or args.experimental_rerun is not None or args.config_path is not None:
        return
    search_path = create_automatic_config_search_path(None, None, conf_dir)
    if args.config_dir is not None:
        search_path.prepend(
            provider="command-line",
            path=f"file://{os.path.abspath(args.config_dir)}",
            anchor=SearchPathQuery(provider="schema"),
        )
    global_hydra = GlobalHydra.instance()
    was_initialized = global_hydra.is_initialized()
    try:
        hydra = Hydra.create_main_hydra2(task_name="evolm", config_search_path=search_path)

        def compose(overrides: list[str]) -> DictConfig:
            return hydra.compose_config(
                config_name=args.config_name or config_name,
                overrides=overrides,
                run_mode=RunMode.MULTIRUN if args.multirun else RunMode.RUN,
                with_log_configuration=False,
            )

        cfg = compose(list(args.overrides))
        if args.multirun:
            check_sweep(compose, list(args.overrides), cfg)
    except MissingConfigException as e:
        raise unknown_option(e, args.overrides) from None
    except ConfigCompositionException as e:
        raise composition_error(e) from None
    except OverrideParseException as e:
        raise ConfigError("command line", first_line(e), "see python -m evolm --help") from None
    finally:
        if not was_initialized:
            global_hydra.clear()


def sweep_values(expression: Any) -> list[str]:
    """The values (as override text) a parsed sweep override gives its trials: a choice's or
    range's, an interval's two ends (as the Optuna sweeper draws them: ints stay ints); none
    for what cannot be listed here (``glob``)."""
    from hydra.core.override_parser.types import Override, Transformer

    if expression.is_interval_sweep():
        interval = expression.value()
        return [Override._get_value_element_as_str(v) for v in (interval.start, interval.end)]
    try:
        return [str(v) for v in expression.sweep_iterator(transformer=Transformer.encode)]
    except Exception:  # glob(...) needs the config loader
        return []


def check_sweep(compose: Any, overrides: list[str], cfg: DictConfig) -> None:
    """Compose the trials of a sweep (see the module docstring); a composition error becomes a
    ConfigError naming the sweep expression it came from."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import ConfigCompositionException, MissingConfigException

    params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
    entries = [(f"{k}={v}", "hydra.sweeper.params") for k, v in params.items()]
    entries += [(o, "the command line") for o in overrides]
    parser = OverridesParser.create()
    plain: list[str] = []
    space: dict[str, tuple[str, list[str]]] = {}  # key -> (where it is swept, trial overrides)
    for entry, where in entries:
        [o] = parser.parse_overrides([entry])
        values = sweep_values(o) if o.is_sweep_override() else []
        if values:
            space[o.key_or_group] = (
                f"{entry!r} of {where}",
                [f"{o.get_key_element()}={v}" for v in values],
            )
        elif not o.is_sweep_override() and where == "the command line":
            plain.append(entry)
            space.pop(o.key_or_group, None)  # a plain value takes the key out of the search
    positions = min(MAX_SWEEP_COMPOSITIONS, max((len(t) for _, t in space.values()), default=0))
    for i in range(positions):
        trial = [t[min(i, len(t) - 1)] for _, t in space.values()]
        try:
            compose(plain + trial)
        except MissingConfigException as e:  # a ConfigCompositionException: first
            raise in_sweep(unknown_option(e, trial), space) from None
        except ConfigCompositionException as e:
            raise in_sweep(composition_error(e), space) from None


def in_sweep(error: ConfigError, space: dict[str, tuple[str, list[str]]]) -> ConfigError:
    """``error`` saying which sweep expression of ``space`` gave the value (itself when none)."""
    key = error.key.lstrip("+~")
    source = space.get(key) or space.get(key.rsplit(".", 1)[0])
    if source is None:
        return error
    return ConfigError(error.key, f"{error.problem} (in the sweep {source[0]})", error.fix)


def first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0].rstrip(".") if str(e).strip() else type(e).__name__


def unknown_option(e: Exception, overrides: Sequence[str]) -> ConfigError:
    """``task=countdwn``: the options of the group and the closest one."""
    missing = getattr(e, "missing_cfg_file", None) or ""
    options = getattr(e, "options", None)
    if not options or "/" not in missing:
        return ConfigError("config", first_line(e), "check --config-name and --config-dir")
    group, option = missing.rsplit("/", 1)
    key = next(
        (o.split("=", 1)[0] for o in overrides if o.lstrip("+~").startswith(f"{group}=")),
        group,
    )
    near = closest(option, options)
    fix = f"did you mean {group}={near[0]}?" if near else f"choose one, e.g. {group}={options[0]}"
    return ConfigError(key, f"no option {option!r}; available: {', '.join(sorted(options))}", fix)


def composition_error(e: Exception) -> ConfigError:
    """A key that is not in its node (``es.sigmaa``), a value of the wrong type, or Hydra's own
    message for anything else."""
    cause = e.__cause__
    key = getattr(cause, "full_key", None)
    parent = getattr(cause, "parent_node", None)
    if not key:
        lines = str(e).strip().splitlines()
        return ConfigError("command line", first_line(e), "; ".join(lines[1:]) or "see --help")
    group = key.rsplit(".", 1)[0] if "." in key else ""
    listing = listing_command(group)
    if type(cause).__name__ in ("ConfigAttributeError", "ConfigKeyError"):
        return unknown_key(key, group, parent, listing)
    problem = getattr(cause, "msg", None) or first_line(cause or e)
    return ConfigError(
        key, str(problem).splitlines()[0], f"give it a value of its type ({listing} shows it)"
    )


def listing_command(group: str) -> str:
    """The command that prints the keys of ``group`` (a dotted node path; "" the root)."""
    if group == "hydra" or group.startswith("hydra."):
        return "python -m evolm --cfg hydra"
    return f"python -m evolm --cfg job{f' --package {group}' if group else ''}"


def unknown_key(key: str, group: str, parent: object, listing: str) -> ConfigError:
    """``es.sigmaa``: the closest keys of its node. A node that is an open mapping (the
    ``callbacks`` dict) also takes new keys, with ``+``."""
    name = key.rsplit(".", 1)[-1]
    valid = [str(k) for k in parent] if isinstance(parent, DictConfig) else []
    near = [f"{group}.{k}" if group else k for k in closest(name, valid)]
    where = f"in {group}" if group else "at the top level"
    if near:
        fix = f"did you mean {' or '.join(near)}? ({listing} lists the keys)"
    elif isinstance(parent, DictConfig) and OmegaConf.get_type(parent) is dict:
        fix = f"to add a new entry there, write +{key}=...; {listing} lists what is there"
    else:
        fix = f"check the spelling: {listing} lists the keys"
    return ConfigError(key, f"no such key {where}", fix)
