"""Build the tiny model in a fresh process whose CPU kernels are pinned, so that every x86-64
machine with AVX2 writes the same bytes (and so runs the same ES run on them).

Which kernels torch runs is fixed when it loads: ATen picks its vectorized kernels by the CPU
(AVX-512 or AVX2: ``ATEN_CPU_CAPABILITY``), MKL its GEMM code path (``MKL_CBWR``). They round
differently, and the warm-up's hundreds of AdamW steps carry a last-bit difference into the
weights: even in float64, the 800-step countdown build gave three different models under ATen's
AVX-512, AVX2 and default kernels on one AMD EPYC (the demo then learned different things).

So :func:`build_pinned` runs the build in a fresh process with ``ATEN_CPU_CAPABILITY=avx2``,
``MKL_CBWR=AVX2,STRICT`` (MKL's conditional numerical reproducibility: the same results on
every CPU that runs that code path) and one thread: the instructions every AVX2 CPU executes
alike (in float64 none of them is an approximation, unlike AVX-512's ``rcp14``). The same bytes
came out with glibc's AVX-512 dispatch switched off (``GLIBC_TUNABLES``) and with 2 threads
asked for. A CPU without AVX2 builds with ATen's default kernels and MKL's compatible path
instead, and says that its bytes differ. The build's log lines reach the caller's loggers.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from evolm.model.tiny.build import TinyArch
    from evolm.model.tiny.warmup import WarmupData

logger = logging.getLogger(__name__)

PINNED_KERNELS: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2,STRICT",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
"""The build process's environment on a CPU with AVX2."""

NO_AVX2_KERNELS: dict[str, str] = {
    **PINNED_KERNELS,
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE,STRICT",
}
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
        line = {"name": record.name, "level": record.levelno, "msg": record.getMessage()}
        self.stream.write(json.dumps(line) + "\n")
        self.stream.flush()


def _child() -> None:
    """The build process: its arguments pickled on stdin, its log records on stdout (anything
    else written to stdout goes to stderr), its traceback on stderr."""
    out, spec, warmup, level = pickle.load(sys.stdin.buffer)
    records = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    root = logging.getLogger()
    root.handlers[:] = [_JsonLines(records)]
    root.setLevel(level)
    import torch  # loads here, with the pinned kernels

    from evolm.model.tiny.build import build_tiny_model

    logger.info(
        "tiny model build process: ATen's %s kernels, MKL_CBWR=%s, %d thread(s)",
        torch.backends.cpu.get_cpu_capability(),
        os.environ.get("MKL_CBWR"),
        torch.get_num_threads(),
    )
    build_tiny_model(out, spec, warmup)


def build_pinned(out: Path, spec: TinyArch, warmup: WarmupData | None = None) -> Path:
    """:func:`~evolm.model.tiny.build.build_tiny_model` into ``out``, in a fresh Python process
    whose CPU kernels are :func:`kernel_env` 's (a subprocess, not multiprocessing: nothing
    re-runs the caller's script); its log lines are logged here, its failure raised here."""
    env = {
        **os.environ,
        **kernel_env(),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p and os.path.isdir(p)),
    }
    level = logging.getLogger("evolm").getEffectiveLevel()
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from evolm.model.tiny.pinned import _child; _child()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            text=False,
        )
        try:
            assert proc.stdin is not None and proc.stdout is not None
            with proc.stdin:
                pickle.dump((out, spec, warmup, level), proc.stdin)
            for line in proc.stdout:
                record = json.loads(line)
                logging.getLogger(record["name"]).log(record["level"], "%s", record["msg"])
            code = proc.wait()
        finally:
            if proc.poll() is None:  # this process was interrupted: so is the build
                proc.kill()
                proc.wait()
        if code:
            stderr.seek(0)
            tail = stderr.read().decode(errors="replace")[-4000:]
            raise RuntimeError(
                f"building the tiny model into {out} failed in its build process (exit code "
                f"{code}):\n{tail}"
            )
    return out
