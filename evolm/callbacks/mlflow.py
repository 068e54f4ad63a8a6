"""Every run in MLflow (``logger=mlflow``, the default): params, metrics, tags, artifacts.

One MLflow run per evolm run, through :class:`mlflow.MlflowClient` only (no fluent active run):

- params: the flattened resolved config (``es.sigma``, ``task._target_``, ...);
- metrics: every record, with ``step = generation`` and the record's names (``train/...``,
  ``eval/...``, ``es/...``, ``time/...``), one ``log_batch`` per generation;
- tags: ``tags`` from the config (task, model, server), ``evolm_version``, ``git_commit`` (and
  MLflow's ``mlflow.source.git.commit``) when the package sits in a git checkout, and
  ``mlflow.parentRunId`` for a child of ``parent_run_id`` (a sweep's parent run);
- artifacts at the end: ``artifacts`` (paths in the run directory, files or folders).

Tracking never costs the run: a failed call is retried (tenacity: ``retries``, backoff from
``backoff_s``), then reported with a warning; unsent metrics go with the next generation; a
store unreachable at the start leaves the run untracked (the run directory is written anyway).
These retries replace MLflow's own HTTP retries (minutes): unless set in the environment,
``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0`` and ``MLFLOW_HTTP_REQUEST_TIMEOUT=timeout_s``.

The run id is checkpoint state (:meth:`state_dict`): a resumed evolm run continues its MLflow
run, re-sends the records the interrupted process had not sent and skips those it had. Every
run is tagged with its run directory (``evolm.run_dir``), which a run holds locked while it runs
(:mod:`evolm.cli.rundir`). A process killed outright (SIGKILL, the OOM killer, a node lost) cannot
end its MLflow run, so at its start a run ends as ``KILLED`` every ``RUNNING`` run of its
experiment whose run directory's lock no process holds; a resume whose checkpoint names no run
(killed before its first checkpoint) carries on the run its directory started instead of
opening a second one.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

import evolm
from evolm import metrics as M
from evolm.callbacks.base import Callback, RunContext
from evolm.callbacks.record import GenerationRecord, Record
from evolm.errors import ConfigError
from evolm.es import ESState
from evolm.files import RUN_DIR_LOCK, lock_held
from evolm.interrupt import deferred, interruption
from evolm.tracking.runinfo import flatten, git_commit
from evolm.tracking.store import mlflow_client

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Metric

log = logging.getLogger(__name__)

T = TypeVar("T")
DEFAULT_ARTIFACTS = (
    "config.yaml",
    "results.jsonl",
    "figures/evolution.png",
    "samples",
    "adapter",
    "adapter-best",
)
PERMANENT = {"INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "RESOURCE_ALREADY_EXISTS"}
MAX_BATCH = 1000  # MLflow's limit on metrics per log_batch
RUN_DIR_TAG = "evolm.run_dir"  # the run directory (resolved) of the evolm run an MLflow run logs


def default_artifact_location(tracking_uri: str) -> str | None:
    """Where a new experiment of a sqlite store keeps artifacts: ``<its folder>/mlartifacts``
    (MLflow's default is ``./mlruns`` under whatever the working directory is); None for a
    tracking server (its own default)."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    db = Path(tracking_uri.removeprefix("sqlite:///")).expanduser()
    return (db.parent.resolve() / "mlartifacts").as_uri()


def _is_transient(error: BaseException) -> bool:
    """Worth retrying: not a KeyboardInterrupt/SystemExit, not an error a retry repeats."""
    return isinstance(error, Exception) and getattr(error, "error_code", None) not in PERMANENT


def _deferred_call(fn: Callable[[], T]) -> T:
    with deferred():
        return fn()


class MLflowLogger(Callback):
    """Logs the run to MLflow (see the module docstring).

    Args:
        tracking_uri: the store: ``sqlite:///outputs/mlflow.db`` (a path relative to the
            working directory) or a tracking server, ``http://host:5000``.
        experiment_name: created if missing.
        run_name: the run's display name (null: MLflow picks one).
        tags: extra run tags (the config gives task, model and server).
        parent_run_id: make this run a child of that run (``mlflow.parentRunId``).
        artifact_location: where a NEW experiment stores artifacts (null: beside a sqlite
            file, ``<its folder>/mlartifacts``; the server's default for a tracking server).
        artifacts: paths in the run directory uploaded at the end; missing ones are skipped.
        retries: retries of a failed call (then a warning); 0 tries once.
        backoff_s: first wait between retries, doubled each time (at most 30 s).
        timeout_s: HTTP timeout of one request to a tracking server.
    """

    def __init__(
        self,
        tracking_uri: str = "sqlite:///outputs/mlflow.db",
        experiment_name: str = "evolm",
        run_name: str | None = None,
        tags: dict[str, str] | None = None,
        parent_run_id: str | None = None,
        artifact_location: str | None = None,
        artifacts: list[str] | None = None,
        retries: int = 3,
        backoff_s: float = 1.0,
        timeout_s: int = 10,
    ) -> None:
        if retries < 0:
            raise ConfigError("retries", f"must be >= 0, got {retries}", "e.g. retries=3")
        if backoff_s < 0:
            raise ConfigError("backoff_s", f"must be >= 0, got {backoff_s}", "e.g. 1.0")
        if timeout_s < 1:
            raise ConfigError("timeout_s", f"must be >= 1, got {timeout_s}", "e.g. 10")
        if importlib.util.find_spec("mlflow") is None:  # a retry cannot install it
            raise ConfigError(
                "_target_",
                "logger=mlflow (the default) logs the run to MLflow, which is not installed",
                "pip install mlflow==3.17.2 (evolm's full install has it), or run with "
                "logger=none (e.g. on an offline machine: docs/offline.md)",
            )
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.run_name = run_name
        self.tags = {k: str(v) for k, v in (tags or {}).items()}
        self.parent_run_id = parent_run_id
        self.artifact_location = artifact_location
        self.artifacts = list(DEFAULT_ARTIFACTS if artifacts is None else artifacts)
        self.retries, self.backoff_s, self.timeout_s = retries, backoff_s, timeout_s
        self.client: MlflowClient | None = None
        self.run_id: str | None = None  # the run this process logs to
        self.resume_run_id: str | None = None  # the run of the checkpoint resumed from
        self.not_uploaded: list[str] = []
        self.pending: list[Metric] = []
        self.failing = False
        self.ending = False  # the run raised: its last calls are tried once
        self.sent_through = -1  # records up to this generation are in the MLflow run
        self.sent_tags: dict[str, str] = {}  # ctx.tags already on the MLflow run
        self.experiment_id: str | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id or self.resume_run_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.resume_run_id = state.get("run_id")

    def on_run_start(self, ctx: RunContext, state: ESState) -> None:
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(self.timeout_s))
        run_dir = str(Path(ctx.output_dir).resolve())
        self.run_id = self._call("start the run", partial(self._start, run_dir, ctx.resumed))
        if self.run_id is None:
            log.warning(
                "MLflow: this run is NOT tracked (store %s unreachable); its results are in %s",
                self.tracking_uri,
                ctx.output_dir,
            )
            return
        continuing = self.run_id == self.resume_run_id
        how = "continuing" if continuing else "new"
        log.info("MLflow: %s run %s in %s", how, self.run_id, self.tracking_uri)
        if not continuing:
            self._log_params(ctx.config)
        self._call("end the runs of dead processes", partial(self._end_dead, run_dir, ctx.resumed))
        for record in ctx.history:
            self._queue(record)
        self._flush()

    def on_generation_end(self, ctx: RunContext, record: GenerationRecord, state: ESState) -> None:
        self._queue(record.as_record())  # one MLflow step: the flat metrics
        self._flush()
        self._sync_tags(ctx)

    def _sync_tags(self, ctx: RunContext) -> None:
        """Copy the run-level tags callbacks set (``ctx.tags``) that MLflow lacks yet."""
        new = {k: v for k, v in ctx.tags.items() if self.sent_tags.get(k) != v}
        if self.run_id is None or not new:
            return
        client, run_id = self._client(), self.run_id
        for key, value in new.items():
            if self._call(f"tag {key}", lambda k=key, v=value: client.set_tag(run_id, k, v) or 1):
                self.sent_tags[key] = value

    def on_run_end(self, ctx: RunContext, summary: Record, state: ESState) -> None:
        if self.run_id is None:
            return
        self._flush()
        self._sync_tags(ctx)
        for name in self.artifacts:
            path = Path(ctx.output_dir) / name
            if path.exists() and self._call(f"upload {name}", partial(self._upload, path, name)):
                continue
            if path.exists():
                self.not_uploaded.append(name)
        self._finish("FINISHED")
        if self.pending or self.not_uploaded:
            lacks = f"{len(self.pending)} metric values and the artifacts {self.not_uploaded}"
            log.warning("MLflow: run %s lacks %s (see %s)", self.run_id, lacks, ctx.output_dir)

    def on_run_error(self, ctx: RunContext, error: BaseException) -> None:
        if self.run_id is None:
            return
        self.ending = True  # one attempt each: the run is ending
        self._flush()
        self._sync_tags(ctx)
        self._finish("FAILED" if interruption(error) is None else "KILLED")  # SIGINT/SIGTERM

    def _queue(self, record: Record) -> None:
        """Queue a record's metrics unless the MLflow run already holds its generation."""
        if self.run_id is None or record["generation"] <= self.sent_through:
            return
        self.pending += self._metrics(record, int(time.time() * 1000))
        self.sent_through = record["generation"]

    def _finish(self, status: str) -> None:
        end = partial(self._client().set_terminated, self.run_id or "", status)
        self._call(f"end the run as {status}", end)

    def _client(self) -> MlflowClient:
        if self.client is None:  # a fresh sqlite store: its folder and schema, created once
            self.client = mlflow_client(self.tracking_uri)
        return self.client

    def _start(self, run_dir: str, resumed: bool) -> str:
        """The checkpoint's run reopened; for a resume whose checkpoint names none, the run
        this run directory started, reopened; else a new run."""
        if self.resume_run_id is not None and self._continue(self.resume_run_id):
            return self.resume_run_id
        earlier = self._run_of(run_dir) if resumed and self.resume_run_id is None else None
        if earlier is not None and self._continue(earlier):
            log.info("MLflow: the checkpoint names no run; %s started in %s", earlier, run_dir)
            self.resume_run_id = earlier
            return earlier
        tags = {**self._run_tags(), RUN_DIR_TAG: run_dir}
        run = self._client().create_run(self._experiment_id(), run_name=self.run_name, tags=tags)
        self.sent_through = -1
        return run.info.run_id

    def _run_of(self, run_dir: str) -> str | None:
        """The newest run of the experiment tagged with ``run_dir`` (None: none)."""
        if "'" in run_dir:  # not expressible in a filter string
            return None
        runs = self._client().search_runs(
            [self._experiment_id()],
            filter_string=f"tags.`{RUN_DIR_TAG}` = '{run_dir}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        return runs[0].info.run_id if runs else None

    def _end_dead(self, run_dir: str, resumed: bool) -> int:
        """End as KILLED the RUNNING runs of the experiment whose process is gone: no process
        holds their run directory's lock (or, for a resume, the directory is this one, which
        this process holds). Runs whose directory cannot be probed (another host, no tag, a
        filesystem without ``flock``) are left alone. Returns how many were ended."""
        client, ended = self._client(), 0
        running = client.search_runs(
            [self._experiment_id()], filter_string="attributes.status = 'RUNNING'"
        )
        for run in running:
            where = run.data.tags.get(RUN_DIR_TAG)
            if (
                run.info.run_id == self.run_id
                or where is None
                or not _gone(where, run_dir, resumed)
            ):
                continue
            client.set_terminated(run.info.run_id, "KILLED")
            ended += 1
            log.warning(
                "MLflow: run %s (run directory %s) was RUNNING, but the process that ran it is "
                "gone: ended it as KILLED",
                run.info.run_id,
                where,
            )
        return ended

    def _log_params(self, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in flatten(config).items()]
        for i in range(0, len(params), 100):  # MLflow's limit per log_batch
            chunk = params[i : i + 100]
            self._call(
                "log params", partial(self._client().log_batch, self.run_id or "", params=chunk)
            )

    def _continue(self, run_id: str) -> bool:
        """Reopen the checkpoint's run (False if this store does not hold it)."""
        from mlflow.exceptions import MlflowException

        try:
            self._client().update_run(run_id, status="RUNNING")
        except MlflowException as e:
            if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            log.warning(
                "MLflow: run %s is not in %s; starting a new run", run_id, self.tracking_uri
            )
            return False
        self.sent_through = self._last_sent(run_id)
        return True

    def _experiment_id(self) -> str:
        if self.experiment_id is None:
            self.experiment_id = self._find_experiment()
        return self.experiment_id

    def _find_experiment(self) -> str:
        client = self._client()
        exp = client.get_experiment_by_name(self.experiment_name)
        if exp is not None:
            return exp.experiment_id
        try:
            return client.create_experiment(self.experiment_name, self._artifact_location())
        except Exception:  # another process created it meanwhile
            exp = client.get_experiment_by_name(self.experiment_name)
            if exp is None:
                raise
            return exp.experiment_id

    def _artifact_location(self) -> str | None:
        return self.artifact_location or default_artifact_location(self.tracking_uri)

    def _run_tags(self) -> dict[str, str]:
        tags = {**self.tags, "evolm_version": evolm.__version__}
        commit = git_commit()
        if commit:
            tags |= {"git_commit": commit, "mlflow.source.git.commit": commit}
        if self.parent_run_id:
            tags["mlflow.parentRunId"] = self.parent_run_id
        return tags

    def _last_sent(self, run_id: str) -> int:
        """The last generation the run holds (every record has eval/ or train/fitness_mean)."""
        steps = [
            m.step
            for key in (M.FITNESS_MEAN, M.EVAL_REWARD)
            for m in self._client().get_metric_history(run_id, key)
        ]
        return max(steps, default=-1)

    def _metrics(self, record: Record, now: int) -> list[Metric]:
        from mlflow.entities import Metric

        step = int(record["generation"])
        return [
            Metric(key, float(v), now, step)
            for key, v in record.items()
            if key != "generation" and isinstance(v, int | float) and not isinstance(v, bool)
        ]

    def _flush(self) -> None:
        run_id, client = self.run_id, self.client
        if run_id is None or client is None:
            return
        while self.pending:
            chunk = self.pending[:MAX_BATCH]
            if not self._call("log metrics", partial(_log_metrics, client, run_id, chunk)):
                return
            del self.pending[: len(chunk)]

    def _upload(self, path: Path, name: str) -> bool:
        if path.is_dir():
            self._client().log_artifacts(self.run_id or "", str(path), artifact_path=name)
        else:
            parent = str(Path(name).parent)
            self._client().log_artifact(
                self.run_id or "", str(path), artifact_path=None if parent == "." else parent
            )
        return True

    def _call(self, what: str, fn: Callable[[], T]) -> T | None:
        """``fn()`` with retries; None (and a warning) when it keeps failing. While calls are
        failing, the next ones are tried once, so a dead server costs a generation little."""
        attempts = 1 if self.failing or self.ending else self.retries + 1
        retrying = Retrying(
            stop=stop_after_attempt(attempts),
            wait=wait_exponential(multiplier=self.backoff_s, max=30.0),
            retry=retry_if_exception(_is_transient),
            reraise=True,
        )
        try:  # each attempt whole: a signal cutting a store transaction can keep its lock
            result = retrying(partial(_deferred_call, fn))
        except Exception as e:
            if not self.failing:
                where = f"{self.tracking_uri} after {attempts} attempt(s)"
                log.warning("MLflow: could not %s at %s: %s", what, where, _short(e))
            self.failing = True
            return None
        if self.failing:
            log.info("MLflow: %s at %s works again", what, self.tracking_uri)
        self.failing = False
        return result


def _gone(where: str, run_dir: str, resumed: bool) -> bool:
    """Whether the process of a run in the run directory ``where`` has ended: nothing holds
    its lock (a resume holds its own directory ``run_dir``: another run there is dead)."""
    if resumed and where == run_dir:
        return True
    return lock_held(Path(where) / RUN_DIR_LOCK) is False


def _log_metrics(client: MlflowClient, run_id: str, metrics: list[Metric]) -> bool:
    client.log_batch(run_id, metrics=metrics)
    return True


def _short(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 300 else text[:300] + "..."
