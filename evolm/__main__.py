"""``python -m evolm`` / ``evolm``: the Hydra app.

python -m evolm task=conciseness es.sigma=0.01 lora.rank=2 es.population_size=16
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

import evolm.config  # noqa: F401  (registers the structured-config schemas)
from evolm import sweep  # noqa: F401  (registers the sweep's ${evolm_sweep_seed:...} resolver)
from evolm.errors import ConfigError, RunAborted
from evolm.trust import hydra_whitelist, precheck

log = logging.getLogger("evolm")
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


def main() -> Any:
    """The CLI. Hydra instantiates only targets of the trust list (:mod:`evolm.trust`): its
    callbacks, sweeper sampler and logging factories included."""
    try:
        whitelist = hydra_whitelist(sys.argv[1:])
        precheck(sys.argv[1:], whitelist)
    except ConfigError as e:
        sys.stderr.write(f"bad configuration: {e}\n")  # before Hydra sets up logging
        raise SystemExit(2) from None
    return hydra.main(config_path=CONF_DIR, config_name="config", execution_whitelist=whitelist)(
        job
    )()


def job(cfg: DictConfig) -> float:
    from evolm.app import train
    from evolm.server.pool import in_multirun

    try:
        return train(cfg)
    except ConfigError as e:
        log.error("bad configuration: %s", e)
        if in_multirun():
            raise  # a sweep records the trial as failed and goes on (SystemExit would end it)
        raise SystemExit(2) from None
    except RunAborted as e:
        log.error("run aborted: %s", e)
        if in_multirun():
            raise
        raise SystemExit(3) from None


if __name__ == "__main__":
    main()
