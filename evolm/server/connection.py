"""The connection to one server: launched by evolm (a subprocess) or attached by URL.

:class:`ServerProcess` runs a server in a new session (process group), so a Ctrl-C in the
terminal reaches evolm only and evolm decides whether to stop it (``keep_alive``); ``stop``
signals the whole group, which also ends the workers that vLLM and SGLang spawn.
:class:`Server` is the HTTP side: a ``requests.Session`` whose requests are retried with
backoff (``tenacity``) on connection errors and timeouts, a ``/health`` probe, attach, launch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from evolm.errors import ConfigError, ServiceUnavailable

log = logging.getLogger(__name__)


# Run in front of a launched server: Linux then SIGTERMs the server when the thread that launched
# it dies, even by SIGKILL (prctl PR_SET_PDEATHSIG survives the exec into the server); such
# servers are started from LAUNCHER's thread, which lives as long as evolm.
DIE_WITH_PARENT = """import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
if os.getppid() != int(sys.argv[1]):
    sys.exit("evolm exited before its server started")
os.execvp(sys.argv[2], sys.argv[2:])
"""


class StartupError(RuntimeError):
    """The server exited or did not become healthy in time; the message holds its log tail."""


def exit_on_sigterm() -> None:
    """Make SIGTERM raise SystemExit, so ``finally`` blocks (the app closes its engine there) and
    atexit run and a launched server is not orphaned. Only from the main thread, and only over
    the default action: a handler someone else installed is left alone."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class _Launcher:
    """A thread that lives as long as the process, to start servers from.

    PR_SET_PDEATHSIG fires when the *thread* that started the child exits, not the process: a
    server started from a short-lived thread (the fleet starts its servers from a thread pool,
    which ends once they are up) was SIGTERMed the moment that pool shut down, and every run
    paid a second start-up when the watchdog restarted it. Started from this daemon thread, a
    server dies with the process only."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, fn: Callable[[], Any]) -> Any:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():  # none yet, or we forked
                self._thread = threading.Thread(
                    target=self._loop, name="evolm-server-launcher", daemon=True
                )
                self._thread.start()
        done: Future[Any] = Future()
        self._jobs.put((fn, done))
        return done.result()

    def _loop(self) -> None:
        while True:
            fn, done = self._jobs.get()
            try:
                done.set_result(fn())
            except BaseException as e:  # handed to the caller
                done.set_exception(e)


LAUNCHER = _Launcher()


class ServerProcess:
    """One launched server; stdout and stderr go to ``log_path``. With ``die_with_parent`` (Linux)
    it is also stopped when evolm dies without cleaning up (SIGKILL, OOM)."""

    def __init__(
        self,
        cmd: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        die_with_parent: bool = False,
    ) -> None:
        self.cmd = list(cmd)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = self.cmd
        if die_with_parent and sys.platform.startswith("linux"):
            argv = [sys.executable, "-c", DIE_WITH_PARENT, str(os.getpid()), *self.cmd]

        def start() -> subprocess.Popen[bytes]:
            with open(log_path, "ab") as out:
                return subprocess.Popen(
                    argv,
                    env=dict(env),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )

        self.popen = LAUNCHER.run(start) if argv is not self.cmd else start()
        log.info("launched pid %d: %s (log: %s)", self.pid, " ".join(self.cmd), log_path)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as e:
            return f"(log {self.log_path} unreadable: {e})"
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, healthy: Callable[[], bool], timeout_s: float, what: str) -> float:
        """Poll ``healthy()`` until it is true; returns the seconds waited.

        Raises :class:`StartupError` (with the log tail) if the process exits or ``timeout_s``
        passes first; the process is stopped then.
        """
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if not self.alive():
                code = self.popen.returncode
                self.stop()
                raise StartupError(self._failure(f"{what} exited with code {code}"))
            if healthy():
                return time.monotonic() - start
            time.sleep(0.5)
        self.stop()
        raise StartupError(self._failure(f"{what} was not healthy after {timeout_s:.0f} s"))

    def _failure(self, problem: str) -> str:
        return (
            f"{problem} during start-up. Command: {' '.join(self.cmd)}\n"
            f"Last lines of {self.log_path}:\n{self.tail()}"
        )

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the process group, then SIGKILL what is left after ``grace_s``."""
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)
            try:
                self.popen.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
            if not self._group_alive():
                break
            time.sleep(0.5)  # workers may outlive the leader by a moment
        log.info("stopped server pid %d", self.pid)

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True


RETRYABLE = (requests.ConnectionError, requests.Timeout)


class ServerDown(ServiceUnavailable):
    """The server did not answer (connection refused or reset, or timeouts) after retries."""


class ServerError(RuntimeError):
    """The server answered with an HTTP error status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.status, self.body = status, body
        super().__init__(f"{method} {path} -> HTTP {status}: {body[:500]}")


class Server:
    """HTTP access to one server of ``kind`` (``vllm``, ``sglang``), launched or attached."""

    def __init__(self, kind: str, request_timeout_s: float, retries: int, pool: int) -> None:
        self.kind, self.request_timeout_s, self.retries = kind, request_timeout_s, retries
        self.url = ""
        self.process: ServerProcess | None = None  # set when evolm launched the server
        self.session = requests.Session()
        self.session.mount("http://", HTTPAdapter(pool_maxsize=max(1, pool)))

    def request(
        self,
        method: str,
        path: str,
        payload: Mapping[str, Any] | None = None,
        *,
        attempts: int | None = None,
        timeout: float | None = None,
    ) -> requests.Response:
        """Send one request; connection errors and timeouts are retried with backoff."""
        retrying = Retrying(
            retry=retry_if_exception_type(RETRYABLE),
            stop=stop_after_attempt(attempts or self.retries + 1),
            wait=wait_exponential(multiplier=0.5, max=8),
            reraise=True,
        )
        try:
            response = retrying(
                self.session.request,
                method,
                self.url + path,
                json=payload,
                timeout=timeout or self.request_timeout_s,
            )
        except RETRYABLE as e:
            raise ServerDown(f"the {self.kind} server at {self.url} did not answer: {e}") from e
        if response.status_code != 200:
            raise ServerError(method, path, response.status_code, response.text)
        return response

    def probe(self) -> str | None:
        """None when ``/health`` answers 200, else why not."""
        try:
            r = self.session.get(self.url + "/health", timeout=min(30.0, self.request_timeout_s))
        except RETRYABLE as e:
            return f"{type(e).__name__}: {e}"
        return None if r.status_code == 200 else f"GET /health answered HTTP {r.status_code}"

    def attach(self, url: str) -> None:
        """Use the running server at ``url``; a ConfigError naming ``server.url`` if unhealthy."""
        self.url = url.rstrip("/")
        problem = self.probe()
        if problem is not None:
            raise ConfigError(
                "url",
                f"no healthy {self.kind} server at server.url={self.url!r} ({problem})",
                f"start one (launchers/{self.kind}_server.sh) and set server.url to its "
                "http://host:port, or set server.url=null to let evolm launch one",
            )
        log.info("attached to the %s server at %s", self.kind, self.url)

    def launch(
        self,
        cmd: list[str],
        env: Mapping[str, str],
        url: str,
        log_path: Path,
        timeout_s: float,
        keep_alive: bool = False,
    ) -> float:
        """Start the server (stopping a previous one first); returns seconds until healthy.
        Unless ``keep_alive``, the server dies with the launching thread (see ServerProcess)."""
        if self.process is not None:
            self.process.stop()
            self.process.log_path.unlink(missing_ok=True)
        self.url = url
        exit_on_sigterm()
        self.process = ServerProcess(cmd, env, log_path, die_with_parent=not keep_alive)
        waited = self.process.wait_ready(
            lambda: self.probe() is None, timeout_s, f"the {self.kind} server"
        )
        log.info("%s server healthy at %s after %.1f s", self.kind, self.url, waited)
        return waited

    def close(self, keep_alive: bool) -> None:
        """Stop a launched server (and delete its log) unless ``keep_alive``."""
        p = self.process
        if p is not None and p.alive() and keep_alive:
            log.warning(
                "keep_alive: the %s server stays up at %s (pid %d, log %s). Attach later runs "
                "with server.url=%s; stop it with: kill -- -%d",
                *(self.kind, self.url, p.pid, p.log_path, self.url, p.pid),
            )
        elif p is not None:
            p.stop()
            p.log_path.unlink(missing_ok=True)
        self.session.close()
