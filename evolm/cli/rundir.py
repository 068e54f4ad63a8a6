"""The run directory: claimed once, the same on every rank, never another run's, one process at
a time.

* :func:`claim` gives a new run its own directory (``fresh``, else ``fresh-1``, ``fresh-2``...,
  each tried with an atomic ``mkdir``). In a process group rank 0 claims it and sends the name to
  the other ranks, which never create a run directory of their own (``${evolm.run_dir:...}`` in
  conf/config.yaml).
* :class:`RunDirGuard`, a Hydra callback, runs before Hydra writes anything into the run
  directory (its ``.hydra/`` and log file). It refuses a new run in a directory that holds
  another run (``hydra.run.dir`` or ``output_dir`` pointing at one: ``resume=`` continues it),
  and takes an exclusive lock on ``<run dir>/.lock`` for the whole run, so a second process on
  the same directory (two ``resume=`` of one run) is refused. The lock is an ``flock``
  (:mod:`filelock`): the kernel drops it when the process ends, SIGKILL included.
* A sweep (``-m``) locks its ``hydra.sweep.dir`` the same way for the whole sweep, and refuses
  one whose trial folders hold the runs of an earlier sweep (its trials ``0/``, ``1/``... would
  overwrite them); each trial locks its own folder (:func:`lock_trial`), so two sweeps never
  interleave their trials in one directory.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from evolm import dist
from evolm.errors import ConfigError
from evolm.files import RUN_DIR_LOCK

LOCK = RUN_DIR_LOCK
RUN_FILES = ("config.yaml", "results.jsonl", "checkpoints", "adapter")
"""What a directory holds once a run has started in it (any one of them)."""

_CLAIMED: dict[str, str] = {}


def claim(fresh: str, comm: dist.Comm | None = None) -> str:
    """The directory of a new run named ``fresh``: ``fresh`` itself, or ``fresh-N`` when taken.

    Rank 0 claims it once per process (the same ``fresh`` again gets the same answer) and
    broadcasts it; the other ranks take rank 0's answer and create nothing. A directory rank 0
    cannot create is an OSError on every rank (none is left waiting).
    """
    if fresh in _CLAIMED:
        return _CLAIMED[fresh]
    comm = comm or dist.current()
    outcome: str | OSError | None = None
    if comm.is_main:
        try:
            outcome = _make_fresh(fresh)
        except OSError as e:
            outcome = e
    outcome = comm.broadcast(outcome)
    if isinstance(outcome, OSError):
        raise outcome
    assert outcome is not None
    _CLAIMED[fresh] = outcome
    return outcome


def unclaim() -> None:
    """Remove the directories this process claimed, and their parent (``outputs/runs/<date>``),
    where still empty (a run refused before it started)."""
    for claimed in _CLAIMED.values():
        for empty in (claimed, os.path.dirname(claimed)):
            with contextlib.suppress(OSError):
                os.rmdir(empty)


def _make_fresh(fresh: str) -> str:
    Path(fresh).parent.mkdir(parents=True, exist_ok=True)
    for n in range(10_000):
        candidate = fresh if n == 0 else f"{fresh}-{n}"
        try:
            os.mkdir(candidate)
        except FileExistsError:
            continue
        return candidate
    raise FileExistsError(f"{fresh} and 10,000 numbered siblings already exist")


def run_files(directory: Path) -> list[str]:
    """The names in ``directory`` that show a run has started there (empty: none)."""
    return [name for name in RUN_FILES if (directory / name).exists()]


def refuse_other_run(directory: Path, key: str) -> None:
    """ConfigError if ``directory`` (set by ``key``) holds a run: a new run must not overwrite
    its results and checkpoints."""
    found = run_files(directory)
    if found:
        raise ConfigError(
            key,
            f"{directory} already holds a run ({', '.join(found)}); a new run there would "
            "overwrite it",
            f"continue that run with resume={directory}, or give the new run another "
            "directory (or leave the key out: each run then gets its own)",
        )


LOCK_WAIT_S = 0.5
"""How long a run waits for its directory's lock: a process probing whether the run that held
it is gone (:func:`evolm.files.lock_held`, the MLflow logger) holds it for an instant."""


def lock(directory: Path, key: str, what: str = "run directory") -> FileLock:
    """An exclusive lock on ``directory`` (held until released or the process ends), or a
    ConfigError naming the directory when another process holds it."""
    held = FileLock(str(directory / LOCK))
    try:
        held.acquire(timeout=LOCK_WAIT_S, poll_interval=0.05)
    except Timeout:
        raise ConfigError(
            key,
            f"{directory} is in use by another evolm process (it holds {directory / LOCK})",
            f"wait for it to end or stop it, then run this again; two processes in one {what} "
            "would interleave what they write there",
        ) from None
    return held


def planned_dirs(config: DictConfig) -> tuple[Path, Path | None]:
    """``(Hydra's run directory, output_dir when set apart from it)`` of a composed config.

    Resolving ``hydra.run.dir`` claims a fresh run's directory (:func:`claim`).
    """
    hydra_dir = Path(str(OmegaConf.select(config, "hydra.run.dir")))
    # the default output_dir (${hydra:runtime.output_dir}) resolves only once the job runs
    output = OmegaConf.select(config, "output_dir", throw_on_resolution_failure=False)
    apart = Path(str(output)) if output is not None else None
    if apart is not None and apart.resolve() == hydra_dir.resolve():
        apart = None
    return hydra_dir, apart


def check(config: DictConfig) -> FileLock | None:
    """Refuse a run directory that holds another run (a new run) or that another process is
    using; the lock taken, to hold for the run (None: a resumed directory that does not exist,
    which the composition root reports)."""
    resume = config.get("resume")
    hydra_dir, apart = planned_dirs(config)
    if resume:
        directory = Path(str(resume))
        return lock(directory, "resume") if directory.is_dir() else None
    refuse_other_run(hydra_dir, "hydra.run.dir")
    if apart is not None:
        refuse_other_run(apart, "output_dir")
    run_dir, key = (apart, "output_dir") if apart is not None else (hydra_dir, "hydra.run.dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    return lock(run_dir, key)


def check_sweep(config: DictConfig) -> FileLock:
    """Lock the sweep's directory (``hydra.sweep.dir``), refusing one that another sweep uses or
    whose trial folders hold runs (a new sweep's trials, numbered from 0 again, would overwrite
    them); the lock taken, to hold for the sweep."""
    sweep_dir = Path(str(OmegaConf.select(config, "hydra.sweep.dir")))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    held = lock(sweep_dir, "hydra.sweep.dir", "sweep directory")
    trials = sorted(
        (p.name for p in sweep_dir.iterdir() if p.is_dir() and run_files(p)),
        key=lambda n: (len(n), n),
    )
    if trials:
        held.release()
        shown = ", ".join(f"{t}/" for t in trials[:5]) + (", ..." if len(trials) > 5 else "")
        raise ConfigError(
            "hydra.sweep.dir",
            f"{sweep_dir} holds the trials of an earlier sweep ({shown}); this sweep's trials, "
            "numbered from 0, would overwrite them",
            "give this sweep another hydra.sweep.dir, or leave it out (each sweep then gets its "
            "own); the study goes on in hydra.sweeper.storage either way",
        )
    return held


def lock_trial(trial_dir: Path) -> FileLock:
    """A sweep trial's folder locked for the trial (a ConfigError, which fails only this trial,
    when another process uses it or it holds a run)."""
    refuse_other_run(trial_dir, "hydra.sweep.dir")
    return lock(trial_dir, "hydra.sweep.dir", "sweep trial folder")


class RunDirGuard(Callback):
    """Hydra callback (``hydra.callbacks.run_dir``): :func:`check` before Hydra writes into the
    run directory, the lock held until the run ends (a sweep: :func:`check_sweep`, held until
    the sweep ends). Rank 0 checks and tells every rank, so all
    refuse together: each with exit 2 and one message on stderr (Hydra has not set up logging
    yet)."""

    def __init__(self) -> None:
        self.held: FileLock | None = None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        comm = dist.current()
        problem: str | None = None
        try:
            planned_dirs(config)  # every rank: the claim is a collective
            if comm.is_main:
                self.held = check(config)
        except (ConfigError, OSError) as e:
            problem = str(e)
        problem = comm.broadcast(problem)
        if problem is not None:
            self.release()
            if comm.is_main:
                unclaim()
            sys.stderr.write(f"bad configuration: {problem}\n")
            raise SystemExit(2)

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.release()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """The sweep's directory (:func:`check_sweep`), before the sweeper starts its study."""
        try:
            self.held = check_sweep(config)
        except (ConfigError, OSError) as e:
            sys.stderr.write(f"bad configuration: {e}\n")
            raise SystemExit(2) from None

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.release()

    def release(self) -> None:
        if self.held is not None:
            self.held.release()
            self.held = None
