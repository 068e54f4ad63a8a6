"""The sweep's Hydra callback (``hydra.callbacks.sweep`` in ``conf/hparams_search/es_optuna.yaml``).

Runs in the sweeping process, around the trials:

- start: checks the search space against the server (a persistent server's
  ``max_lora_rank`` must cover every rank searched: else the sweep ends before any trial) and
  the study's sqlite file, marks FAIL the RUNNING trials of dead processes
  (:mod:`evolm.sweep.stale`),
  creates the folders of sqlite URLs, opens the study's MLflow parent run
  (:mod:`evolm.sweep.parent_run`) and exports its id and store to the trials' MLflow logger
  (``MLFLOW_PARENT_RUN_ID``, ``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``);
- before each trial: records its owner process on the trial;
- after each trial: the best trial so far onto the parent (several objectives, as
  ``hparams_search=es_pareto``: the Pareto front so far);
- end: the final best from the study (several objectives: the Pareto-optimal trials, logged
  one per line), and how many engines the sweep started (one, unless the ``server`` node
  changed between trials).

Hydra turns an exception raised in a callback into a warning, so a bad configuration ends the
sweep here with ``SystemExit(2)``, and tracking errors are logged, never raised.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from evolm import metrics as M
from evolm.errors import ConfigError
from evolm.sweep import stale
from evolm.sweep.study import Finished, directions, front, study_counts, summarize

log = logging.getLogger(__name__)


def search_space(config: DictConfig) -> dict[str, str]:
    """``key -> expression`` as the Optuna sweeper sees it: ``hydra.sweeper.params`` then the
    command line's overrides (a later one wins; a plain value fixes the key)."""
    entries = [f"{k}={v}" for k, v in (config.hydra.sweeper.params or {}).items()]
    entries += list(config.hydra.overrides.task)
    space: dict[str, str] = {}
    for entry, o in zip(entries, OverridesParser.create().parse_overrides(entries), strict=True):
        if not o.is_delete():
            space[o.get_key_element()] = entry.split("=", 1)[1].strip()
    return space


def candidate_values(expression: str) -> list[Any]:
    """The values a sweep expression can take (for intervals: its ends)."""
    [o] = OverridesParser.create().parse_overrides([f"x={expression}"])
    if not o.is_sweep_override():
        return [o.value()]
    if o.is_interval_sweep():
        return [o.value().start, o.value().end]  # type: ignore[union-attr]
    return list(o.sweep_iterator())


def check_rank_cover(config: DictConfig, space: dict[str, str]) -> None:
    """A persistent server fixes ``--max-lora-rank`` at start: it must cover every rank."""
    server = config.server
    if "max_lora_rank" not in server or "lora.rank" not in space:
        return
    ranks = [int(r) for r in candidate_values(space["lora.rank"])]
    have, top = server.max_lora_rank, max(ranks)
    if (have is None and len(set(ranks)) > 1) or (have is not None and have < top):
        raise ConfigError(
            "server.max_lora_rank",
            f"is {have}, but the sweep searches lora.rank up to {top} and the server's "
            "--max-lora-rank is fixed when it starts",
            f"set server.max_lora_rank={top} (the largest rank searched)",
        )


def ensure_sqlite_dir(url: str | None) -> None:
    """sqlite cannot create the folder of its file: create it (``sqlite:///outputs/x.db``)."""
    if url and url.startswith("sqlite:///") and ":memory:" not in url:
        Path(url.removeprefix("sqlite:///")).expanduser().parent.mkdir(parents=True, exist_ok=True)


def objectives(config: DictConfig) -> list[str]:
    """The metrics the trials return (``optimized_metric``: one name or a list)."""
    names = config.optimized_metric
    return [names] if isinstance(names, str) else [str(n) for n in names]


def check_sweep_objectives(config: DictConfig) -> None:
    """One direction per objective; a KL objective needs an engine that scores it (local)."""
    names, ways = objectives(config), directions(config.hydra.sweeper)
    if len(names) != len(ways):
        raise ConfigError(
            "hydra.sweeper.direction",
            f"has {len(ways)} direction(s) {ways} for the {len(names)} objective(s) {names} of "
            "optimized_metric",
            "give one direction per objective, e.g. hydra.sweeper.direction=[maximize,minimize]",
        )
    target = str(config.server.get("_target_", ""))
    kl = [n for n in names if n in (M.EVAL_KL_MEAN, M.EVAL_KL_STD)]
    if kl and not target.startswith("evolm.engine.local"):
        raise ConfigError(
            "server",
            f"{kl} is scored by the local engine only; this sweep's server is {target}",
            "use server=local, or drop the KL objective (hparams_search=es_optuna)",
        )


def parse_value(text: str) -> Any:
    value = OverridesParser.create().parse_overrides([f"x={text}"])[0].value()
    return value if isinstance(value, int | float | str | bool) else text


class SweepCallback(Callback):
    """Hydra callback of ``hparams_search=es_optuna`` (see the module docstring).

    Args:
        tracking_uri: the MLflow store (``null``: no parent run; MLflow stays off).
        experiment_name: the MLflow experiment of the parent and of the trials.
        artifact_location: of a new experiment (null: as the MLflow logger does).
    """

    def __init__(
        self,
        tracking_uri: str | None,
        experiment_name: str = "evolm",
        artifact_location: str | None = None,
    ) -> None:
        self.tracking_uri, self.experiment_name = tracking_uri, experiment_name
        self.artifact_location = artifact_location
        self.parent: Any = None  # evolm.sweep.parent_run.SweepRun (mlflow imports lazily)
        self.space: dict[str, str] = {}
        self.own: list[Finished] = []  # the trials this process ran
        self.first_error: str | None = None  # of the first trial of this process that failed

    # -- Hydra hooks -----------------------------------------------------------------------
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Hydra turns a callback's exception into a warning and sweeps on: trials would run
        # without their study's checks or their MLflow parent. End the sweep here instead.
        try:
            self._start(config)
        except Exception as e:
            log.exception("the sweep could not start: %s", e)
            raise SystemExit(1) from None

    def _start(self, config: DictConfig) -> None:
        sweeper = config.hydra.sweeper
        self.space = search_space(config)
        try:
            check_rank_cover(config, self.space)
            check_sweep_objectives(config)
            stale.check_storage(sweeper.get("storage"))
            if self.tracking_uri is not None and sweeper.get("study_name") is None:
                raise ConfigError(
                    "hydra.sweeper.study_name",
                    "is null: the study and its MLflow parent run are found by name",
                    "name it, e.g. hydra.sweeper.study_name=my_sweep",
                )
        except ConfigError as e:
            log.error("bad configuration: %s", e)
            raise SystemExit(2) from None
        ensure_sqlite_dir(sweeper.get("storage"))
        stale.fail_stale_trials(sweeper)
        if self.tracking_uri is None:
            return
        from evolm.sweep.parent_run import PARENT_ENV, SweepRun

        ensure_sqlite_dir(self.tracking_uri)
        self.parent = SweepRun(
            self.tracking_uri,
            self.experiment_name,
            sweeper.study_name,
            sweeper.storage,
            self.artifact_location,
        )
        os.environ[PARENT_ENV] = self.parent.run_id
        os.environ["MLFLOW_TRACKING_URI"] = self.tracking_uri
        os.environ["MLFLOW_EXPERIMENT_NAME"] = self.experiment_name
        sampler = sweeper.sampler
        settings = {
            "direction": ",".join(directions(sweeper)),
            "objectives": ",".join(objectives(config)),
            "sampler": sampler.get("_target_"),
            "seed": config.seed,  # the sampler's seed derives from it (resolving it reads the DB)
            "n_trials": sweeper.n_trials,
            "dir": config.hydra.sweep.dir,
        }
        sweeps = {k: v for k, v in self.space.items() if _is_sweep(v)}
        self.parent.record_search(sweeps, settings)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Record this process as the owner of the trial (evolm.sweep.stale)."""
        try:
            overrides = config.hydra.overrides.task
            stale.claim_trial(config.hydra.sweeper, self._params(overrides))
        except Exception as e:  # best effort: never ends a sweep
            log.debug("could not record the trial's owner: %s", e)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        value = None
        if job_return.status is JobStatus.COMPLETED:  # NaN: optuna records a failure
            value = _finite(job_return._return_value, len(directions(config.hydra.sweeper)))
        if value is None and self.first_error is None:
            self.first_error = _error_text(job_return)
        done = Finished(self._params(job_return.overrides or ()), value)
        self.own.append(done)
        self._update(config, pending=done)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from evolm.app.pool import POOL
        from evolm.engine.local import LocalEngine

        log.info(
            "engine pool: %d engine(s) started, reused by %d trial(s); LocalEngine.loads=%d",
            POOL.started,
            POOL.reused,
            LocalEngine.loads,
        )
        self._update(config, pending=None)
        if len(directions(config.hydra.sweeper)) > 1:
            self._log_front(config)
        if self.parent is not None:
            self.parent.finish()
        if self.own and all(f.value is None for f in self.own):
            self._all_failed(config)

    def _all_failed(self, config: DictConfig) -> None:
        """Every trial of this process failed. If the study holds no completed trial either,
        Optuna's sweeper would end on ``ValueError: Record does not exist.`` (it asks for the
        best trial): end the sweep here instead, with evolm's message and exit status 1."""
        message = (
            f"all {len(self.own)} trials of this sweep failed (first error: "
            f"{self.first_error or 'see the logs'}); every trial's log is in "
            f"{config.hydra.sweep.dir}/<trial>/*.log"
        )
        try:
            complete, _ = study_counts(config.hydra.sweeper)
        except Exception as e:  # an unreadable study: the sweeper cannot go on either
            log.warning("could not read the study: %s", e)
            complete = 0
        if complete:
            log.error("%s; the study's best trial is unchanged", message)
            return
        log.error("%s. Fix the error above and run the sweep again", message)
        raise SystemExit(1)

    # -- helpers ---------------------------------------------------------------------------
    def _params(self, overrides: Sequence[str]) -> dict[str, Any]:
        keys = {k for k, v in self.space.items() if _is_sweep(v)}
        pairs = (o.split("=", 1) for o in overrides if "=" in o)
        return {k: parse_value(v) for k, v in pairs if k in keys}

    def _update(self, config: DictConfig, pending: Finished | None) -> None:
        """The best trial so far (several objectives: the Pareto front) onto the parent run
        (best effort: never ends a sweep)."""
        if self.parent is None:
            return
        sweeper = config.hydra.sweeper
        try:
            if len(directions(sweeper)) > 1:
                pareto, complete, failed = front(sweeper, self.own, pending)
                self.parent.record_front(pareto, objectives(config), complete, failed)
                return
            best, complete, failed = summarize(sweeper, self.own, pending)
            self.parent.record_best(best, complete, failed)
        except Exception as e:
            log.warning("could not update the sweep's MLflow parent run: %s", e)

    def _log_front(self, config: DictConfig) -> None:
        """The Pareto-optimal trials of the study (or of this process, in memory), one a line."""
        try:
            pareto, complete, _ = front(config.hydra.sweeper, self.own, None)
        except Exception as e:  # an unreadable study: the sweeper reports it
            log.warning("could not read the study's Pareto front: %s", e)
            return
        names = objectives(config)
        ways = directions(config.hydra.sweeper)
        goals = ", ".join(f"{d} {n}" for d, n in zip(ways, names, strict=True))
        log.info("Pareto front: %d of %d completed trial(s) (%s):", len(pareto), complete, goals)
        for b in pareto:
            values = b.value if isinstance(b.value, tuple) else (b.value,)
            shown = ", ".join(f"{n}={v:.6g}" for n, v in zip(names, values, strict=True))
            log.info("  trial %s: %s, params %s", b.number, shown, b.params)


def _is_sweep(expression: str) -> bool:
    [o] = OverridesParser.create().parse_overrides([f"x={expression}"])
    return o.is_sweep_override()


def _error_text(job_return: JobReturn) -> str:
    """What a finished trial returned instead of a value: its exception, or the value."""
    value = job_return._return_value
    if isinstance(value, BaseException):
        return str(value) or type(value).__name__
    return f"it returned {value!r}, not a finite number"


def _finite(value: object, objectives: int = 1) -> float | tuple[float, ...] | None:
    """A trial's finite value (several objectives: a tuple of that many), else None."""
    if objectives > 1:
        if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != objectives:
            return None
        values = [_finite(v) for v in value]
        return None if None in values else tuple(v for v in values if isinstance(v, float))
    try:
        value = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None
