"""``python -m evolm`` / ``evolm``: the Hydra app.

python -m evolm task=conciseness es.sigma=0.01 lora.rank=2 es.population_size=16
"""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig

import evolm.config  # noqa: F401  (registers the structured-config schemas)
from evolm import sweep  # noqa: F401  (registers the sweep's ${evolm_sweep_seed:...} resolver)
from evolm.errors import ConfigError, RunAborted

log = logging.getLogger("evolm")
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
# What Hydra itself instantiates from evolm's configs (``hydra.callbacks``): trusted by the app,
# so Hydra needs no legacy, warn-and-allow path for it. Run-time targets: ``trusted_targets``.
HYDRA_TRUSTED = ["evolm.sweep.callback.SweepCallback"]


@hydra.main(config_path=CONF_DIR, config_name="config", execution_whitelist=HYDRA_TRUSTED)
def main(cfg: DictConfig) -> float:
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
