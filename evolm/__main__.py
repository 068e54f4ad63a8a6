"""``python -m evolm`` / ``evolm``: the Hydra app.

python -m evolm task=conciseness es.sigma=0.01 lora.rank=2 es.population_size=16
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

import evolm.config  # noqa: F401  (registers the structured-config schemas)
from evolm import dist, sweep  # noqa: F401  (registers the sweep's ${evolm_sweep_seed:...} resolver)
from evolm.errors import ConfigError, RunAborted

log = logging.getLogger("evolm")
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


@hydra.main(config_path=CONF_DIR, config_name="config")
def hydra_main(cfg: DictConfig) -> float:
    from evolm.app import train
    from evolm.server.pool import in_multirun

    joined = False
    if dist.current().world_size == 1 and dist.launch_env().world_size > 1:
        dist.setup()  # a task of a multi-task SLURM job started by submitit (hydra/launcher=slurm)
        joined = True
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
    finally:
        if joined:
            dist.teardown()


def main() -> None:
    """The CLI: joins the process group first when launched by torchrun or SLURM with several
    processes (:mod:`evolm.dist`), so every rank shares rank 0's clock (``${evolm.now:...}``:
    one run directory), then runs the Hydra app."""
    launch = dist.launch_env()
    if launch.world_size > 1:
        multirun = any(a in ("-m", "--multirun") for a in sys.argv[1:])
        if multirun and launch.source == "torchrun":
            log.error(
                "bad configuration: -m under torchrun: every rank would run its own sweeper. "
                "Fix: one sweep worker per GPU (launchers/sweep_workers.sh, docs/distributed.md)"
            )
            raise SystemExit(2)
        dist.setup()
        if launch.rank > 0:  # the run directory and its .hydra/ and log file are rank 0's
            sys.argv += [
                "hydra.output_subdir=null",
                "hydra.job_logging.handlers.file.filename="
                f"${{hydra.runtime.output_dir}}/rank{launch.rank}.log",
            ]
    try:
        hydra_main()
    finally:
        dist.teardown()


if __name__ == "__main__":
    main()
