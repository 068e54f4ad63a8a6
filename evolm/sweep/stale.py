"""A sweep's study survives its processes: check its file, and fail trials whose process died.

* :func:`check_storage`: an Optuna sqlite file that is not a database (corrupt, truncated,
  overwritten) ends the sweep with one message naming the file, before Optuna's traceback.
* Every trial records its owner (``host:pid``, user attribute :data:`OWNER`) when its job
  starts (:func:`claim_trial`); a sweep that starts marks FAIL every RUNNING trial whose owner
  process on this host is gone (:func:`fail_stale_trials`): a SIGKILLed sweep leaves none
  RUNNING forever. Trials owned by live processes (a second worker) or other hosts are left.
"""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from optuna.trial import TrialState

from evolm.errors import ConfigError
from evolm.sweep.study import existing_study

log = logging.getLogger(__name__)

OWNER = "evolm.owner"


def check_storage(url: str | None) -> None:
    """Refuse an sqlite study file that SQLite cannot read."""
    if not url or not url.startswith("sqlite:///") or ":memory:" in url:
        return
    path = Path(url.removeprefix("sqlite:///")).expanduser()
    if not path.is_file() or path.stat().st_size == 0:
        return
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            [(result,)] = db.execute("PRAGMA quick_check").fetchall()[:1]
    except sqlite3.DatabaseError as e:
        result = str(e)
    if result != "ok":
        raise ConfigError(
            "hydra.sweeper.storage",
            f"{path} is not a usable SQLite database ({result})",
            f"move it aside (mv {path} {path}.corrupt) to start the study again, or restore it "
            "from a backup",
        )


def owner() -> str:
    """This process, as recorded on the trials it runs."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def claim_trial(sweeper: DictConfig, params: dict[str, Any]) -> None:
    """Record this process as the owner of the RUNNING, unowned trial with ``params``."""
    study = existing_study(sweeper)
    if study is None:
        return
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if OWNER not in t.user_attrs and t.params == params:
            study._storage.set_trial_user_attr(t._trial_id, OWNER, owner())
            return


def fail_stale_trials(sweeper: DictConfig) -> list[int]:
    """Mark FAIL the RUNNING trials whose owner process on this host is gone; their numbers."""
    study = existing_study(sweeper)
    if study is None:
        return []
    host = socket.gethostname()
    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        who = str(t.user_attrs.get(OWNER, ""))
        trial_host, _, pid = who.rpartition(":")
        if trial_host == host and pid.isdigit() and not _alive(int(pid)):
            study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
            failed.append(t.number)
    if failed:
        log.warning(
            "trials %s of study %r were RUNNING but their process (%s) is gone: marked FAIL",
            failed,
            study.study_name,
            host,
        )
    return failed
