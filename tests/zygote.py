"""``python -m evolm`` for the tests without its imports: a process that has imported what
every CLI run imports (torch, transformers, hydra, mlflow, matplotlib: ~8 s of a tiny run's
~15-20 s on a 2-core CPU) forks one child per run, and the child is the CLI.

    python -m tests.zygote      # reads requests on stdin, answers on stdout (JSON lines)

A request is ``{"argv", "cwd", "env", "stdout", "stderr"}``. The zygote forks; the child
changes to ``cwd``, takes ``env`` as its whole environment, points its stdin at /dev/null and
its stdout and stderr at the two files, and runs ``evolm`` as ``python -m evolm`` does
(``runpy._run_module_as_main`` in a fresh ``__main__`` module), then exits through the
interpreter's own exit. The zygote answers ``{"pid"}`` once the child runs (a test may signal
it) and ``{"returncode"}`` when it ends (``-N``: killed by signal N, as :mod:`subprocess` says
it).

The child is a real process running the real CLI; what it shares with its siblings is what
happened before the fork:
- the imported modules: so a run whose environment would change how a module loads
  (``PYTHONPATH``, thread counts, hub settings...) cannot come here: :func:`tests.helpers.run_cli`
  sends only runs whose environment differs from the zygote's in :data:`PER_RUN_ENV` (variables
  read when a run reads them, not when a module loads), and runs the others in a plain
  subprocess; warnings printed while importing went to the zygote's log, not to a run's stderr;
- the hash seed (``PYTHONHASHSEED``): forked runs order sets alike, so a test that compares runs
  across interpreters (a resume against a run from the start) runs one side with
  ``run_cli(..., fresh=True)``.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import threading
import types
from pathlib import Path
from typing import IO, Any, NoReturn

PER_RUN_ENV = frozenset(
    {
        "MLFLOW_TRACKING_URI",
        "HYDRA_FULL_ERROR",
        "EVOLM_CACHE_DIR",
        "EVOLM_COUNTDOWN_JSON",
        "PYTEST_CURRENT_TEST",
        "TORCHINDUCTOR_CACHE_DIR",
        "_MLFLOW_TELEMETRY_SESSION_ID",
    }
)
"""The variables a run may set differently from the zygote's environment: each is read when the
run reads it (MLflow's store, Hydra's error mode, evolm's model cache and data file), never when
a module is imported. ``TORCHINDUCTOR_CACHE_DIR`` is one torch's compiler sets in the tests'
own process, to its default, the first time a test compiles; ``_MLFLOW_TELEMETRY_SESSION_ID``
one MLflow sets in every process that imports it (its telemetry's session, which child
processes join), in the tests' own after the zygote's environment was taken."""


PRELOAD = (
    "matplotlib.figure",
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
    for name in PRELOAD:
        importlib.import_module(name)
    del sys.modules["evolm.__main__"]  # each child runs it afresh as __main__, as python -m does
    extra = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    native = [name for name in thread_names()[1:] if name not in FORK_SAFE_THREADS]
    if extra or native:
        raise RuntimeError(f"preloading started threads {extra or native}: a fork loses them")


FORK_SAFE_THREADS = frozenset({"jemalloc_bg_thd"})
"""Native threads a fork may lose: jemalloc's background purger (pyarrow's allocator, loaded by
MLflow) is an optimization that its fork handlers leave the child without."""


def thread_names() -> list[str]:
    """This process's threads, the main one first, native ones (OpenMP's pool, a tokenizer's...)
    included."""
    tasks = Path("/proc/self/task")
    ids = sorted(os.listdir(tasks), key=lambda t: t != str(os.getpid()))
    return [(tasks / t / "comm").read_text().strip() for t in ids]


def child(request: dict[str, Any]) -> NoReturn:
    """The forked CLI run: from its setup on, what CPython does for ``python -m evolm``
    (``runpy._run_module_as_main`` in a fresh ``__main__``). An exception or ``SystemExit``
    leaves through the interpreter's own exit, as a fresh interpreter's would: its excepthook,
    exit code (a ``KeyboardInterrupt`` re-raises SIGINT), thread joins, atexit handlers and
    stream flushes."""
    os.chdir(request["cwd"])
    sys.path[0] = os.getcwd()  # what ``python -m`` puts first: the working directory
    os.environ.clear()
    os.environ.update(request["env"])
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    os.close(stdin)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.modules["__main__"] = types.ModuleType("__main__")
    sys.argv = ["-m", *request["argv"]]  # runpy puts the module's path first
    runpy._run_module_as_main("evolm")  # type: ignore[attr-defined]
    raise SystemExit(0)


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
