"""The command line composed once before Hydra runs it, so a misspelt key or an unknown option is
a :class:`~evolm.errors.ConfigError` (exit 2, one message) that names the key as the user wrote
it and the valid choices, instead of Hydra's exit 1 naming internal classes (``Builds_ES``) and
suggesting ``+es.sigmaa=...`` (which adds the misspelt key and fails later).

Composition follows ``@hydra.main`` exactly (the same search path, ``--config-dir``,
``--config-name``; a multirun's sweep overrides are left out as Hydra's own first composition
leaves them out), and costs a tenth of a second: the schemas it imports, Hydra needs anyway.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf

from evolm.errors import ConfigError


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
        hydra.compose_config(
            config_name=args.config_name or config_name,
            overrides=list(args.overrides),
            run_mode=RunMode.MULTIRUN if args.multirun else RunMode.RUN,
            with_log_configuration=False,
        )
    except MissingConfigException as e:
        raise unknown_option(e, args.overrides) from None
    except ConfigCompositionException as e:
        raise composition_error(e) from None
    except OverrideParseException as e:
        raise ConfigError("command line", first_line(e), "see python -m evolm --help") from None
    finally:
        if not was_initialized:
            global_hydra.clear()


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
