"""``python -m evolm`` / ``evolm``: the Hydra app.

python -m evolm task=conciseness es.sigma=0.01 lora.rank=2 es.population_size=16

A run that fails on a known cause logs one message and exits non-zero without a traceback
(``HYDRA_FULL_ERROR=1`` shows it): bad configuration 2, aborted on purpose 3, a service that
stays down 4. A run that fails before it started leaves no run directory behind. SIGINT and
SIGTERM stop a run cleanly (:mod:`evolm.interrupt`): its last finished generation is
checkpointed, the resume command logged, and the exit code is 130 or 143 (128 + the signal).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import NoReturn

import hydra
from omegaconf import DictConfig

import evolm.config  # noqa: F401  (registers the structured-config schemas)
from evolm import (
    dist,
    interrupt,
    sweep,  # noqa: F401  (registers its ${evolm_sweep_seed:...} resolver)
)
from evolm.cli import rundir
from evolm.cli.rundir import LOCK
from evolm.errors import ConfigError, RunAborted, ServiceUnavailable
from evolm.preflight.compose_check import check_command_line
from evolm.preflight.trust import hydra_whitelist, precheck

log = logging.getLogger("evolm")
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
EXIT = {ConfigError: 2, RunAborted: 3, ServiceUnavailable: 4}
WHAT = {
    ConfigError: "bad configuration",
    RunAborted: "run aborted",
    ServiceUnavailable: "run failed",
}


def job(cfg: DictConfig) -> float | list[float]:
    """One Hydra job: a training run (a sweep's trial too)."""
    from evolm.app import train
    from evolm.app.pool import in_multirun

    what = "run directory (resumed):" if cfg.resume is not None else "run directory:"
    log.info("%s %s", what, cfg.output_dir)  # first: a run logging to a file says where it is
    joined = finished = False
    held = None
    if dist.current().world_size == 1 and dist.launch_env().world_size > 1:
        dist.setup()  # a task of a multi-task SLURM job started by submitit (hydra/launcher=slurm)
        joined = True
    try:
        if in_multirun() and dist.current().is_main:  # a sweep's trial: its folder, locked
            held = rundir.lock_trial(Path(cfg.output_dir))
        value = train(cfg)
        finished = True
        return value
    except (ConfigError, RunAborted, ServiceUnavailable) as e:
        kind = next(k for k in EXIT if isinstance(e, k))
        log.error("%s: %s", WHAT[kind], e)
        if isinstance(e, ServiceUnavailable) and cfg.resume is None:
            log.error("its checkpoints are kept: python -m evolm resume=%s", cfg.output_dir)
        if in_multirun() or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise  # a sweep records the trial as failed and goes on (SystemExit would end it)
        if cfg.resume is None and dist.current().rank == 0:
            remove_unstarted(Path(cfg.output_dir))
        raise SystemExit(EXIT[kind]) from None
    except BaseException as e:
        stop = None if isinstance(e, SystemExit) else interrupt.interruption(e)
        if stop is None or in_multirun():
            raise  # a sweep ends on Ctrl-C / SIGTERM
        stopped(cfg, stop)
    finally:
        if held is not None:
            held.release()
        if joined:
            dist.teardown(finished)


def stopped(cfg: DictConfig, stop: interrupt.Interrupted) -> NoReturn:
    """End a run stopped by SIGINT/SIGTERM: the resume command of a started run, no traceback,
    exit ``128 + signal``."""
    run_dir = Path(cfg.output_dir)
    if cfg.resume is not None or (run_dir / "config.yaml").exists():
        log.error("run stopped by %s; continue it: python -m evolm resume=%s", stop.name, run_dir)
    else:
        log.error("stopped by %s before the run started", stop.name)
        if dist.current().rank == 0:
            remove_unstarted(run_dir)
    raise SystemExit(stop.exit_code) from None


def remove_unstarted(run_dir: Path) -> None:
    """Delete the run directory Hydra made for a run that failed before it started: it holds
    only Hydra's ``.hydra/``, log files and the run's lock (a started run has its
    ``config.yaml``)."""
    if not run_dir.is_dir() or (run_dir / "config.yaml").exists():
        return
    if any(p.name not in (".hydra", LOCK) and p.suffix != ".log" for p in run_dir.iterdir()):
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    log.info("removed %s: the run did not start", run_dir)
    day = run_dir.parent  # outputs/runs/<date>/ (the default hydra.run.dir), if now empty
    if day.parent.name == "runs":
        with contextlib.suppress(OSError):  # not empty: another run started meanwhile
            day.rmdir()


def allocator_defaults(env: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """CUDA memory in expandable segments unless the user configured the allocator: a run
    re-plans its KV cache between training (3,480 rows) and evaluation (2,400 longer rows), and
    with fixed segments the freed cache stayed split and the next 53.5 GiB block found no room
    (1.5B on an H200, 4 runs of 4 out of memory at their first re-plan; with expandable segments
    none, through 2-3 re-plans each). Read by torch at its first CUDA allocation."""
    if "PYTORCH_CUDA_ALLOC_CONF" not in env and "PYTORCH_ALLOC_CONF" not in env:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"


def main() -> None:
    """The CLI. Hydra instantiates only targets of the trust list (:mod:`evolm.preflight.trust`):
    its callbacks, sweeper sampler and logging factories included. Launched by torchrun or
    SLURM with several processes, it joins the process group first (:mod:`evolm.dist`), so every
    rank shares rank 0's clock (``${evolm.now:...}``: one run directory)."""
    argv = sys.argv[1:]
    allocator_defaults()
    interrupt.install()  # SIGTERM stops a run like Ctrl-C: checkpoint, MLflow KILLED, resume
    try:
        whitelist = hydra_whitelist(argv)
        precheck(argv, whitelist)
        if os.environ.get("HYDRA_FULL_ERROR") != "1":  # else Hydra's own error and traceback
            check_command_line(argv, CONF_DIR)
    except ConfigError as e:
        sys.stderr.write(f"bad configuration: {e}\n")  # before Hydra sets up logging
        raise SystemExit(2) from None
    launch = dist.launch_env()
    if launch.world_size > 1:
        if any(a in ("-m", "--multirun") for a in argv) and launch.source == "torchrun":
            sys.stderr.write(
                "bad configuration: -m under torchrun: every rank would run its own sweeper. "
                "Fix: one sweep worker per GPU (launchers/sweep_workers.sh, docs/distributed.md)\n"
            )
            raise SystemExit(2)
        dist.setup()
        if launch.rank > 0:  # the run directory and its .hydra/ and log file are rank 0's
            sys.argv += [
                "hydra.output_subdir=null",
                "hydra.job_logging.handlers.file.filename="
                f"${{hydra.runtime.output_dir}}/rank{launch.rank}.log",
            ]
    finished = False
    try:
        hydra.main(config_path=CONF_DIR, config_name="config", execution_whitelist=whitelist)(job)()
        finished = True
    finally:
        dist.teardown(finished)  # every rank leaves the group together, before interpreter exit


if __name__ == "__main__":
    main()
