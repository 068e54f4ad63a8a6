"""SIGINT and SIGTERM stop a run the same clean way.

Ctrl-C sends SIGINT; ``kill``, schedulers (SLURM's ``scancel`` and time limit), ``torchrun``
forwarding its own stop, ``docker stop`` and Kubernetes send SIGTERM, whose default action ends
the process at once: no checkpoint of the generations since the last one, the MLflow run left
RUNNING. :func:`install` makes both raise :class:`Interrupted` (a ``KeyboardInterrupt``) in the
main thread, so the loop's ``on_run_error`` hooks run: the checkpointer saves the last finished
generation, the MLflow logger ends its run as KILLED, and the CLI prints the resume command and
exits ``128 + signal`` (130, 143), the code a shell gives a process the signal ended.

Code that an exception must not cut in the middle (a database transaction of the MLflow store:
SQLAlchemy may keep the write lock of a half-done one, and every later call then waits for
sqlite's busy timeout) runs under :func:`deferred`: a signal received there is raised when the
block ends.

A signal that comes while the run is already stopping (a second Ctrl-C, or SIGTERM from both
the scheduler and ``torchrun``) is logged and ignored, so it cannot cut a checkpoint or the
MLflow update short; SIGKILL still ends the process at once.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from types import FrameType

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = []  # the signals received since install(), in order
_deferring = [0]  # depth of nested deferred() blocks (main thread)
_raised = [False]  # the first signal's Interrupted was raised
_previous: dict[int, object] = {}  # the handlers install() replaced


class Interrupted(KeyboardInterrupt):
    """The run was stopped by ``signum`` (SIGINT or SIGTERM)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """``128 + signum``: what a shell reports for a process ended by the signal."""
        return 128 + self.signum


def _handle(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    if len(_received) > 1:
        log.warning(
            "%s received while the run is stopping: ignored (SIGKILL ends it at once)",
            signal.Signals(signum).name,
        )
        return
    log.warning("%s received: stopping the run", signal.Signals(signum).name)
    if not _deferring[0]:
        _raised[0] = True
        raise Interrupted(signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while the block runs: received there, its :class:`Interrupted` is
    raised when the (outermost) block ends. Other threads run their blocks as they are (signal
    handlers run in the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _deferring[0] += 1
    try:
        yield
    finally:
        _deferring[0] -= 1
    if not _deferring[0] and _received and not _raised[0]:
        _raised[0] = True
        raise Interrupted(_received[0])


def install() -> None:
    """Make SIGINT and SIGTERM raise :class:`Interrupted` (main thread only; a signal the
    process was started ignoring, such as SIGINT in a background job, stays ignored)."""
    if threading.current_thread() is not threading.main_thread():
        return
    _received.clear()
    _raised[0] = False
    for signum in SIGNALS:
        previous = signal.getsignal(signum)
        if previous is not signal.SIG_IGN and previous is not _handle:
            _previous[signum] = previous
            signal.signal(signum, _handle)


def uninstall() -> None:
    """Restore the handlers :func:`install` replaced and forget the signals received."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, previous in _previous.items():
        signal.signal(signum, previous)  # type: ignore[arg-type]
    _previous.clear()
    _received.clear()
    _raised[0] = False


def received() -> Interrupted | None:
    """The interruption, once a signal has come (None before)."""
    return Interrupted(_received[0]) if _received else None


def interruption(error: BaseException) -> Interrupted | None:
    """The interruption that ``error`` is, or that caused it: in a process group a rank stopped
    by a signal can make another rank's collective fail before that rank's own signal is
    handled; the run is then interrupted, not failed. None for a real failure."""
    if isinstance(error, Interrupted):
        return error
    if isinstance(error, KeyboardInterrupt):  # no handler installed (train() called directly)
        return Interrupted(signal.SIGINT)
    return received()
