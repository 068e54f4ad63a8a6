"""Shared sqlite stores (``outputs/mlflow.db``, ``outputs/optuna.db``) opened by many processes.

MLflow and Optuna create their tables (and run their schema migrations) the first time a
process opens a fresh database. Two processes doing it at once (two sweep workers, two runs
started together) collide: ``duplicate column name``, alembic's ``Online migration expected to
match one row``, ``table _alembic_tmp_experiments already exists``; the loser's run goes
untracked, and a migration cut in half leaves the store broken for every later run.
:func:`sqlite_lock` serialises that first open across processes with a file lock beside the
database (``mlflow.db.lock``, :func:`evolm.files.file_lock`); once the schema exists the lock is
cheap and held only while a process opens its client. Every opener takes it: a run's MLflow
logger, a sweep's parent run and callback, Optuna's study lookup.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from evolm.files import file_lock

if TYPE_CHECKING:
    from mlflow import MlflowClient

SQLITE = "sqlite:///"


def sqlite_file(url: str | None) -> Path | None:
    """The database file of a ``sqlite:///path`` URL (None: another store, or in memory)."""
    if not url or not url.startswith(SQLITE) or ":memory:" in url:
        return None
    return Path(url.removeprefix(SQLITE)).expanduser()


@contextmanager
def sqlite_lock(url: str | None) -> Iterator[None]:
    """Hold an exclusive lock on ``<db>.lock`` (creating the folder) for a sqlite ``url``;
    no lock for any other store."""
    db = sqlite_file(url)
    if db is None:
        yield
        return
    with file_lock(db.with_name(db.name + ".lock")):
        yield


def mlflow_client(tracking_uri: str) -> MlflowClient:
    """An MLflow client whose store exists: its schema is created (or migrated) under
    :func:`sqlite_lock`, so concurrent processes on a fresh sqlite store do not collide."""
    from mlflow import MlflowClient

    with sqlite_lock(tracking_uri):
        client = MlflowClient(tracking_uri=tracking_uri)
        client.search_experiments(max_results=1)  # opens the store: creates the tables once
    return client
