"""Files shared between processes and users: inter-process locks and atomic directory writes.

:func:`file_lock` serialises work across processes (the first open of a fresh sqlite store) with
a lock file beside what it guards (``filelock``: the lock is the OS's, released when its holder
exits, even killed); :func:`lock_held` tells whether a lock file's holder is still alive.

:func:`temp_dir_beside` and :func:`publish_dir` write a whole directory (a cached model, the run's
adapter, an exported model) atomically: built in a hidden temp dir beside the target, then
renamed onto it, so a reader sees the old directory or the new one, never a half-written one.
Before the rename every entry gets the mode the process umask gives a new file (``0644`` / folders
``0755`` under umask ``0022``): ``tempfile.mkdtemp`` makes its folder ``0700`` and safetensors
writes its weights ``0600``, which other users of a shared cache or results folder could not read.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock

RUN_DIR_LOCK = ".lock"
"""The lock file a run holds in its run directory for as long as it runs
(:mod:`evolm.cli.rundir`)."""


def file_lock(path: Path) -> FileLock:
    """An exclusive inter-process lock on ``path`` (created with its folder on first use); use it
    as a context manager. Re-entrant through the same lock object (not a second one made by
    another call: that waits like another process)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(path)


def lock_held(path: Path) -> bool | None:
    """Whether some process holds the ``flock`` on the lock file ``path`` (a
    :func:`file_lock`, a run directory's ``.lock``): True held, False free (its holder ended,
    SIGKILL included: the kernel dropped the lock), None when it cannot be told (no such file,
    unreadable, or a filesystem without ``flock``). The probe takes a shared lock for an instant
    and creates nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        return True if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) else None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process umask (read from ``/proc`` where it can be: setting it to read it is a race
    with other threads creating files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(root: Path) -> None:
    """Give ``root`` and everything below it the modes a new file or folder gets under the
    current umask (executables keep their execute bits); symlinks are left alone."""
    mask = current_umask()
    for entry in [root, *root.rglob("*")]:
        mode = entry.lstat().st_mode
        if stat.S_ISLNK(mode):
            continue
        full = 0o777 if stat.S_ISDIR(mode) or mode & 0o111 else 0o666
        entry.chmod(full & ~mask)


@contextmanager
def temp_dir_beside(target: Path) -> Iterator[Path]:
    """A new empty hidden folder in ``target``'s parent (created if missing), removed at the end
    unless :func:`publish_dir` moved it onto ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish_dir(tmp: Path, target: Path, replace: bool = True) -> bool:
    """Rename the finished folder ``tmp`` onto ``target`` after :func:`apply_umask`; True if it
    is there now. An existing ``target`` is replaced (moved aside, then removed) when
    ``replace``; else it is kept and False returned (another process published first)."""
    apply_umask(tmp)
    if replace and target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
        return True
    try:
        os.rename(tmp, target)
    except OSError:
        if replace or not target.exists():
            raise
        return False
    return True
