"""``python -m evolm`` for the tests without its imports: a process that has imported what
every CLI run imports (torch, transformers, hydra, mlflow, matplotlib: ~10 s of a tiny run's
~15-20 s on a 2-core CPU) forks one child per run, and the child is the CLI.

    python -m tests.zygote      # reads requests on stdin, answers on stdout (JSON lines)

A request is ``{"argv", "cwd", "env", "stdout", "stderr"}``. The zygote forks; the child
changes to ``cwd``, takes ``env`` as its whole environment, points its stdin at /dev/null and
its stdout and stderr at the two files, and runs ``evolm.__main__`` as ``__main__`` with
``argv`` (as ``python -m evolm`` does: ``runpy``), then exits the way the interpreter would:
its non-daemon threads joined, its atexit handlers run, its streams flushed, ``SystemExit``'s
code (an uncaught exception: its traceback and 1). The zygote answers ``{"pid"}`` once the
child runs (a test may signal it) and ``{"returncode"}`` when it ends (``-N``: killed by
signal N, as :mod:`subprocess` says it).

The child is a real process running the real CLI; what it shares with its siblings is only the
modules imported before the fork. So a run whose environment would change how a module loads
(``PYTHONPATH``, thread counts, hub settings...) cannot come here: :func:`tests.helpers.run_cli`
sends only runs whose environment differs from the zygote's in :data:`PER_RUN_ENV` (variables
read when a run reads them, not when a module loads), and runs the others in a plain
subprocess.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import runpy
import sys
import threading
import traceback
from typing import IO, Any

PER_RUN_ENV = frozenset(
    {
        "MLFLOW_TRACKING_URI",
        "HYDRA_FULL_ERROR",
        "EVOLM_CACHE_DIR",
        "EVOLM_COUNTDOWN_JSON",
        "PYTEST_CURRENT_TEST",
        "TORCHINDUCTOR_CACHE_DIR",
    }
)
"""The variables a run may set differently from the zygote's environment: each is read when the
run reads it (MLflow's store, Hydra's error mode, evolm's model cache and data file), never when
a module is imported. ``TORCHINDUCTOR_CACHE_DIR`` is one torch's compiler sets in the tests'
own process, to its default, the first time a test compiles."""


PRELOAD = (
    "matplotlib.pyplot",
    "mlflow",
    "mlflow.store.tracking.sqlalchemy_store",
    "alembic",  # MLflow's migrations of a new store
    "transformers",
    "transformers.models.qwen2.modeling_qwen2",
    "hydra_zen",
    "tenacity",
    "evolm.__main__",
    "evolm.app.run",
    "evolm.callbacks.checkpoint",
    "evolm.callbacks.health",
    "evolm.callbacks.mlflow",
    "evolm.callbacks.plot",
    "evolm.callbacks.progress",
    "evolm.callbacks.results",
    "evolm.callbacks.samples",
    "evolm.engine.fast.backend",
    "evolm.engine.hf.backend",
    "evolm.engine.local",
    "evolm.task.conciseness",
    "evolm.task.countdown",
    "evolm.tracking.plot",
    "evolm.tracking.store",
)
"""What a tiny CLI run imports (its heavy part: ``python -X importtime`` and the modules a run
adds), imported before the fork."""


def preload() -> None:
    """Import :data:`PRELOAD`, and check that nothing started a thread (a fork keeps only the
    forking thread)."""
    import matplotlib

    matplotlib.use("Agg")
    for name in PRELOAD:
        importlib.import_module(name)
    del sys.modules["evolm.__main__"]  # each child runs it afresh as __main__, as python -m does
    extra = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if extra:
        raise RuntimeError(f"preloading started threads {extra}: a fork would lose them")


def exit_code(code: object) -> int:
    """The exit status of ``SystemExit(code)``, as the interpreter makes it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    sys.stderr.write(f"{code}\n")
    return 1


def child(request: dict[str, Any]) -> None:
    """The forked CLI run (never returns)."""
    code = 1
    try:
        os.chdir(request["cwd"])
        sys.path[0] = os.getcwd()  # what ``python -m`` puts first: the working directory
        os.environ.clear()
        os.environ.update(request["env"])
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        sys.argv = ["-m", *request["argv"]]  # runpy puts the module's path first
        try:
            runpy.run_module("evolm", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = exit_code(e.code)
        except BaseException:
            traceback.print_exc()
            code = 1
        threading._shutdown()  # type: ignore[attr-defined]  (what the interpreter's exit does)
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed stream: nothing left to flush
                stream.flush()
        os._exit(code)


def serve(requests: IO[str], answers: IO[str]) -> None:
    """Fork a child per request line, one at a time; answer its pid, then its return code."""
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            requests.close()
            answers.close()
            child(request)
        answers.write(json.dumps({"pid": pid}) + "\n")
        answers.flush()
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        answers.flush()


def main() -> None:
    # The protocol keeps its own copies of stdin/stdout; fds 0 and 1 go to /dev/null so that
    # nothing printed while preloading can corrupt it.
    requests = os.fdopen(os.dup(0), "r")
    answers = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    preload()
    answers.write(json.dumps({"ready": os.getpid()}) + "\n")
    answers.flush()
    serve(requests, answers)


if __name__ == "__main__":
    main()
