"""The MLflow parent run of a sweep: one per Optuna study, its trials are its children.

The parent is found by a tag holding the study's identity (name + storage), so running the
same sweep again, or a second worker on the same study, adds children to the SAME parent. Its
id reaches the trials through the environment (``MLFLOW_PARENT_RUN_ID``); the MLflow logger
of each trial starts its run as a child of it. The parent holds the search space (tags
``search_space.<key>``), the sweep's settings (``sweep.*``), and the best trial so far (metric
``best_value`` and ``best/<key>`` per numeric parameter, stepped by finished trials; tags
``best_params``, ``best_trial``), updated after every trial.

Only :class:`mlflow.MlflowClient` is used: the fluent API's active run stays the trials'.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, RunTag
from mlflow.exceptions import MlflowException
from mlflow.utils.time import get_current_time_millis

from evolm.tracking.store import mlflow_client, sqlite_lock

log = logging.getLogger(__name__)

PARENT_ENV = "MLFLOW_PARENT_RUN_ID"
MAX_TAG = 8000  # MLflow's limit on a tag value
KEY_TAG = "evolm.sweep_key"


def normalize_storage(storage: str | None) -> str:
    """The storage URL with relative sqlite paths made absolute and any password hidden."""
    if storage is None:
        return "memory"
    from sqlalchemy.engine import make_url

    url = make_url(storage)
    if url.drivername.startswith("sqlite") and url.database not in (None, "", ":memory:"):
        url = url.set(database=str(Path(url.database).resolve()))
    return url.render_as_string(hide_password=True)


def sweep_key(study_name: str, storage: str | None) -> str:
    """What identifies a study, hence its parent run."""
    ident = f"{study_name}@{normalize_storage(storage)}"
    return hashlib.sha1(ident.encode()).hexdigest()[:16]


def artifact_location(tracking_uri: str, location: str | None) -> str | None:
    """Where a new experiment keeps artifacts, as the MLflow logger decides it: beside a sqlite
    store (``<its folder>/mlartifacts``), not MLflow's ``./mlruns`` in the working directory."""
    if location is not None or not tracking_uri.startswith("sqlite:///"):
        return location
    db = Path(tracking_uri.removeprefix("sqlite:///")).expanduser()
    return (db.parent.resolve() / "mlartifacts").as_uri()


def experiment_id(client: MlflowClient, name: str, location: str | None = None) -> str:
    """The experiment's id, created if missing (tolerates a worker creating it concurrently)."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name, location)
    except MlflowException:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


@dataclass(frozen=True)
class Best:
    """The best trial so far: its optuna number (None: not told yet), value and params."""

    number: int | None
    value: float | tuple[float, ...]  # a tuple: one value per objective (es_pareto)
    params: dict[str, Any]


class SweepRun:
    """The parent run of the study ``study_name`` in ``storage`` (found or created);
    ``location``: the artifact location of a new experiment (None: as the MLflow logger)."""

    def __init__(
        self,
        tracking_uri: str,
        experiment_name: str,
        study_name: str,
        storage: str | None,
        location: str | None = None,
    ) -> None:
        self.client = mlflow_client(tracking_uri)  # a fresh store's schema: created once
        location = artifact_location(tracking_uri, location)
        self.experiment_id = experiment_id(self.client, experiment_name, location)
        self.key = sweep_key(study_name, storage)
        with sqlite_lock(tracking_uri):  # a sqlite store: one worker at a time finds or creates
            found = self._parents()
            if found:
                self.run_id = found[0]
                self.client.update_run(self.run_id, status="RUNNING")
                log.info("MLflow: resuming the sweep's parent run %s", self.run_id)
            else:
                self.run_id = self._create(study_name, storage)
                log.info("MLflow: the sweep's parent run is %s", self.run_id)

    def _parents(self) -> list[str]:
        """Live parent runs with this key, oldest first (ties broken by id)."""
        runs = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`{KEY_TAG}` = '{self.key}'"
        )
        runs = sorted(runs, key=lambda r: (r.info.start_time, r.info.run_id))
        return [r.info.run_id for r in runs]

    def _create(self, study_name: str, storage: str | None) -> str:
        tags = {
            KEY_TAG: self.key,
            "evolm.study_name": study_name,
            "evolm.storage": normalize_storage(storage),
        }
        run = self.client.create_run(self.experiment_id, tags=tags, run_name=f"sweep {study_name}")
        # Two workers on a tracking server may create a parent at once: each keeps the oldest.
        oldest = self._parents()[0]
        if oldest != run.info.run_id:
            self.client.delete_run(run.info.run_id)
        return oldest

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def record_search(self, space: Mapping[str, str], settings: Mapping[str, Any]) -> None:
        """The search space (``key -> sweep expression``) and the sweeper's settings."""
        self.set_tags(
            {
                **{f"search_space.{k}": v for k, v in space.items()},
                **{f"sweep.{k}": v for k, v in settings.items()},
            }
        )

    def record_best(self, best: Best | None, complete: int, failed: int) -> None:
        """The best trial so far and the trial counts (metrics stepped by finished trials)."""
        now, step = get_current_time_millis(), complete + failed
        metrics = [Metric("trials_complete", complete, now, step)]
        metrics.append(Metric("trials_failed", failed, now, step))
        tags: list[RunTag] = []
        if best is not None:
            metrics.append(Metric("best_value", best.value, now, step))
            metrics += [
                Metric(f"best/{k}", float(v), now, step)
                for k, v in best.params.items()
                if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            ]
            tags.append(RunTag("best_params", json.dumps(best.params, sort_keys=True)))
            if best.number is not None:
                tags.append(RunTag("best_trial", str(best.number)))
        self.client.log_batch(self.run_id, metrics=metrics, tags=tags)

    def record_front(self, front: list[Best], names: list[str], complete: int, failed: int) -> None:
        """A multi-objective sweep's Pareto front so far (metric ``pareto_size``; tag
        ``pareto_trials``: each trial's number, objective values by name, and params) and the
        trial counts."""
        now, step = get_current_time_millis(), complete + failed
        metrics = [
            Metric("trials_complete", complete, now, step),
            Metric("trials_failed", failed, now, step),
            Metric("pareto_size", len(front), now, step),
        ]
        trials = [
            {
                "trial": b.number,
                **dict(
                    zip(names, b.value if isinstance(b.value, tuple) else (b.value,), strict=True)
                ),
                "params": b.params,
            }
            for b in front
        ]
        text = json.dumps(trials, sort_keys=True)
        while len(text) > MAX_TAG:  # the best trials of the first objective that fit
            trials.pop()
            text = json.dumps(trials, sort_keys=True)
        tags = [RunTag("pareto_trials", text)]
        self.client.log_batch(self.run_id, metrics=metrics, tags=tags)

    def finish(self) -> None:
        self.client.update_run(self.run_id, status="FINISHED")
