"""Build the tiny model in a fresh process whose CPU kernels are pinned, so that every x86-64
machine with AVX2, Intel or AMD, writes the same bytes (and so runs the same ES run).

Which kernels torch runs is fixed when it loads: ATen picks its vectorized kernels by the CPU
(AVX-512 or AVX2: ``ATEN_CPU_CAPABILITY``), MKL its GEMM code path (``MKL_CBWR``). They round
differently, and the warm-up's hundreds of AdamW steps carry a last-bit difference into the
weights: even in float64, the 800-step countdown build gave three different models under ATen's
AVX-512, AVX2 and default kernels on one AMD EPYC (the demo then learned different things).

So :func:`build_pinned` runs the build in a fresh process with ``ATEN_CPU_CAPABILITY=avx2``,
``MKL_CBWR=COMPATIBLE,STRICT`` and one thread: the instructions every AVX2 CPU executes alike
(in float64 none of them is an approximation, unlike AVX-512's ``rcp14``). MKL's branch is
its compatible one (SSE2 without the approximate reciprocals) because its ``AVX2`` branch is
reproducible on Intel CPUs only: elsewhere MKL quietly runs its ``AUTO`` branch instead (its
developer guide, "Getting Started with Conditional Numerical Reproducibility"). Pinned to
``AVX2``, an AMD EPYC and an Intel Xeon built different models (session 24); to
``COMPATIBLE`` the branch is the same code on both. One op still rounded by the CPU's vendor
whatever the pins: ``torch.sqrt`` goes to MKL's vector math, which puts ~1.4% of float64 square
roots one ulp off, not the same ones on an Intel Xeon and an AMD EPYC (Zen 3), and the unfused
AdamW step takes one per weight per step; so the warm-up runs the fused AdamW, whose square
root is ATen's (the instruction's, exact). A 200-step float64 warm-up then gave the same weights
on both (session 32). The same bytes came out with glibc's AVX-512 dispatch switched off
(``GLIBC_TUNABLES``) and with 2 threads asked for. A CPU without AVX2
builds with ATen's default kernels instead, and says that its bytes differ. The build's log
lines reach the caller's loggers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from evolm.model.tiny.build import TinyArch
    from evolm.model.tiny.warmup import WarmupData

logger = logging.getLogger(__name__)

PINNED_KERNELS: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE,STRICT",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
"""The build process's environment on a CPU with AVX2."""

NO_AVX2_KERNELS: dict[str, str] = {**PINNED_KERNELS, "ATEN_CPU_CAPABILITY": "default"}
"""... and on one without (its bytes differ from :data:`PINNED_KERNELS`' builds)."""


def has_avx2() -> bool:
    """Whether this CPU runs AVX2 (whatever ``ATEN_CPU_CAPABILITY`` this process loaded with)."""
    import torch

    probe = getattr(torch.cpu, "_is_avx2_supported", None)
    return bool(probe()) if probe is not None else "AVX" in torch.backends.cpu.get_cpu_capability()


def kernel_env() -> dict[str, str]:
    """The environment the build process gets: :data:`PINNED_KERNELS`, or
    :data:`NO_AVX2_KERNELS` (with a warning) on a CPU without AVX2."""
    if has_avx2():
        return PINNED_KERNELS
    logger.warning(
        "this CPU has no AVX2: the tiny model is built with ATen's default kernels, so its bytes "
        "(and every run on it) differ from an AVX2 machine's, and from the numbers in README.md"
    )
    return NO_AVX2_KERNELS


class _JsonLines(logging.Handler):
    """The build process's log records, one JSON line each, for :func:`build_pinned` to log."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__()
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if record.exc_info:
                msg += "\n" + logging.Formatter().formatException(record.exc_info)
            line = {"name": record.name, "level": record.levelno, "msg": msg}
            self.stream.write(json.dumps(line) + "\n")
            self.stream.flush()
        except Exception:  # logging's contract: a bad record never kills the build
            self.handleError(record)


def _exit_with_parent() -> None:
    """Read stdin to its end, then exit: the parent holds it open until the build is done, and
    the system closes it when the parent dies (even of SIGKILL), so no orphan builds on."""
    while os.read(0, 1 << 16):  # the raw descriptor: no buffer lock held at interpreter exit
        pass
    os._exit(1)


def _child() -> None:
    """The build process: its arguments pickled on stdin (kept open: :func:`_exit_with_parent`),
    its log records on stdout (anything else written to stdout goes to stderr, which the parent
    shows after), its traceback on stderr."""
    out, spec, warmup, level = pickle.load(sys.stdin.buffer)
    threading.Thread(target=_exit_with_parent, daemon=True).start()
    records = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    root = logging.getLogger()
    root.handlers[:] = [_JsonLines(records)]
    root.setLevel(level)
    logging.captureWarnings(True)
    import torch  # loads here, with the pinned kernels

    from evolm.model.tiny.build import build_tiny_model

    logger.info(
        "tiny model build process: ATen's %s kernels, MKL_CBWR=%s, %d thread(s)",
        torch.backends.cpu.get_cpu_capability(),
        os.environ.get("MKL_CBWR"),
        torch.get_num_threads(),
    )
    build_tiny_model(out, spec, warmup)


# -c puts "" (the working directory) first on the child's path; dropped (as -P would), so the
# child imports the evolm its parent did, through PYTHONPATH (the parent's path), not one that
# happens to be in the working directory.
_CHILD = (
    "import sys\n"
    "if sys.path[:1] == ['']: del sys.path[0]\n"
    "from evolm.model.tiny.pinned import _child\n"
    "_child()"
)


def _check_importable(*objs: object) -> None:
    """The build process unpickles its arguments by their classes' module paths."""
    for obj in objs:
        if obj is not None and type(obj).__module__ == "__main__":
            raise TypeError(
                f"{type(obj).__name__} is defined in __main__, which the tiny model's build "
                "process cannot import: define it in a module (evolm.model.tiny.pinned)"
            )


def _relay(line: bytes) -> None:
    """Log one line of the build process's records here (a stray line as it is)."""
    try:
        record = json.loads(line)
        name, level, msg = record["name"], int(record["level"]), str(record["msg"])
    except (ValueError, KeyError, TypeError):
        name, level, msg = __name__, logging.INFO, line.decode(errors="replace").rstrip()
    logging.getLogger(name).log(level, "%s", msg)


def build_pinned(out: Path, spec: TinyArch, warmup: WarmupData | None = None) -> Path:
    """:func:`~evolm.model.tiny.build.build_tiny_model` into ``out``, in a fresh Python process
    whose CPU kernels are :func:`kernel_env` 's (a subprocess, not multiprocessing: nothing
    re-runs the caller's script); its log lines are logged here, what else it wrote to stderr
    is written to this process's stderr, its failure is raised here, and it ends with this
    process. ``spec`` and ``warmup`` travel pickled: their classes must be importable."""
    _check_importable(spec, warmup)
    env = {
        **os.environ,
        **kernel_env(),
        # this process's path, in its order ("": the working directory, as an absolute path)
        "PYTHONPATH": os.pathsep.join(os.path.abspath(p or os.curdir) for p in sys.path),
    }
    level = min(
        logging.getLogger().getEffectiveLevel(), logging.getLogger("evolm").getEffectiveLevel()
    )
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
        )
        try:
            assert proc.stdin is not None and proc.stdout is not None
            pickle.dump((out, spec, warmup, level), proc.stdin)
            proc.stdin.flush()  # stdin stays open: the child exits when it closes
            for line in proc.stdout:
                _relay(line)
            code = proc.wait()
        finally:
            if proc.poll() is None:  # this process was interrupted: so is the build
                proc.kill()
                proc.wait()
            with contextlib.suppress(OSError):
                proc.stdin.close()  # type: ignore[union-attr]
            proc.stdout.close()  # type: ignore[union-attr]
        stderr.seek(0)
        written = stderr.read().decode(errors="replace")
        if code:
            raise RuntimeError(
                f"building the tiny model into {out} failed in its build process (exit code "
                f"{code}):\n{written[-4000:]}"
            )
        if written:
            sys.stderr.write(written)  # its warnings and progress bars, as in this process
    return out
