"""Where a server engine writes its members' adapters: a per-process tmpfs folder.

``/dev/shm/evolm-<pid>/<run>/g<gen>/m<member>`` (the temp directory where there is no
/dev/shm). Engines delete their folders on close; what a killed process left behind is removed
by the next engine that starts, and this process's folder once more at exit.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

_AT_EXIT: set[Path] = set()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def adapter_root(run: str) -> Path:
    """The adapter folder of one engine (``run``: its random id) in this process."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    for folder in base.glob("evolm-*"):
        pid = folder.name.removeprefix("evolm-")
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
    mine = base / f"evolm-{os.getpid()}"
    if mine not in _AT_EXIT:
        # atexit runs after the executor threads are joined, so it also removes what a write
        # still in flight at Ctrl-C created after the engine had cleaned up.
        _AT_EXIT.add(mine)
        atexit.register(shutil.rmtree, mine, True)
    return mine / run
