"""Shared sqlite stores (``outputs/mlflow.db``, ``outputs/optuna.db``) opened by many processes.

MLflow and Optuna create their tables (and run their schema migrations) the first time a
process opens a fresh database. Two processes doing it at once (two sweep workers, two runs
started together) collide: ``duplicate column name``, alembic's ``Online migration expected to
match one row``; the loser's callback or logger then fails and its runs lose their sweep parent.
:func:`sqlite_lock` serialises that first open across processes with a file lock beside the
database (``mlflow.db.lock``); once the schema exists the lock is cheap and held only while a
process opens its client.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

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
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def mlflow_client(tracking_uri: str) -> MlflowClient:
    """An MLflow client whose store exists: its schema is created (or migrated) under
    :func:`sqlite_lock`, so concurrent processes on a fresh sqlite store do not collide."""
    from mlflow import MlflowClient

    with sqlite_lock(tracking_uri):
        client = MlflowClient(tracking_uri=tracking_uri)
        client.search_experiments(max_results=1)  # opens the store: creates the tables once
    return client
