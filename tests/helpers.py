"""Helpers shared by tests: compose the real config, run the real CLI."""

from __future__ import annotations

import atexit
import collections
import contextlib
import errno
import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import evolm.config  # noqa: F401  (registers the schemas)
from evolm.callbacks import GenerationRecord
from evolm.es import TellStats
from tests.zygote import PER_RUN_ENV

if TYPE_CHECKING:
    from evolm.model import TinyModel
    from evolm.model.tiny.warmup import WarmupData

REPO = Path(__file__).resolve().parents[1]
CONF = str(REPO / "conf")
SESSION_ENV = dict(os.environ)  # as the tests started (conftest's thread settings included)

# The tests' countdown model: conf/model/tiny.yaml's countdown warm-up (what `task=countdown`
# builds) at a quarter of its steps: the same code path and data, built in about 4 minutes of
# one core of a 2-core AMD EPYC instead of the demo model's 13-17. Runs of task=countdown in
# the tests add COUNTDOWN_MODEL to get it (conftest builds it in the background:
# `countdown_model_dir`); the demo's own model (COUNTDOWN_DEMO, 800 steps) is built by slow
# tests only (`make test-all`).
COUNTDOWN_DEMO = {
    "warmup_steps": 800,
    "countdown_share": 0.75,
    "countdown_untagged": 0.5,
    "max_position_embeddings": 2048,  # a prompt + task.max_new_tokens=1024 fit
}
COUNTDOWN_TINY = {**COUNTDOWN_DEMO, "warmup_steps": 200}
COUNTDOWN_MODEL = [f"model.warmup_steps={COUNTDOWN_TINY['warmup_steps']}"]


def tiny_model(spec: dict[str, Any]) -> tuple[TinyModel, WarmupData | None]:
    """The :class:`evolm.model.TinyModel` of a model spec (conftest's ``MODEL_FIXTURES``), and
    the warm-up data its build reads (the countdown task's where it has a ``countdown_share``):
    what the fixtures and the background prebuild both resolve."""
    from evolm.model import TinyModel
    from evolm.task.countdown.warmup import CountdownWarmup

    return TinyModel(**spec), CountdownWarmup() if spec.get("countdown_share") else None


class NoLocks:
    """A lock on a filesystem that takes none (``flock`` fails with ENOLCK, as on some network
    mounts, which the CI machine has not): put in place of ``evolm.model.cache.file_lock``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def acquire(self, timeout: float | None = None) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    def release(self) -> None:
        raise AssertionError("a lock never taken is released")


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    with initialize_config_dir(config_dir=CONF):
        return compose("config", overrides=list(overrides))


def run_cli(
    args: Sequence[str],
    timeout: float = 300,
    cwd: Path = REPO,
    env: dict[str, str] | None = None,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``python -m evolm ARGS`` in a child process (offline, tqdm off): forked from the tests'
    zygote (:mod:`tests.zygote`, the imports done once) when ``env`` changes only variables a run
    reads itself, else (and with ``fresh``: a new interpreter, its own hash seed) a plain
    subprocess."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", **(env or {})}
    if fresh:
        ZYGOTE.counts["plain: fresh"] += 1
    forked = None if fresh else ZYGOTE.run(args, timeout, cwd, full_env)
    return forked or subprocess.run(
        [sys.executable, "-m", "evolm", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=full_env,
    )


class Zygote:
    """The client of ``python -m tests.zygote``: started at its first run, one run at a time.
    On unless ``EVOLM_TEST_ZYGOTE=0``. :meth:`run` answers None (the caller runs a plain
    subprocess) when it is off, when the run's environment would change an import, while
    another run holds the zygote, and after the zygote failed; :attr:`counts` says how often
    each happened (the session's summary line)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self._log = Path(os.devnull)
        self._busy = threading.Lock()
        self.off = os.environ.get("EVOLM_TEST_ZYGOTE", "1") == "0"
        self.last_pid = 0
        self.counts: collections.Counter[str] = collections.Counter()

    @staticmethod
    def base_env() -> dict[str, str]:
        """The zygote's environment: the one the tests started with (not a test's
        monkeypatched one), as ``run_cli`` passes it."""
        return {**SESSION_ENV, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}

    def differ(self, env: dict[str, str]) -> list[str]:
        """The variables outside :data:`PER_RUN_ENV` that ``env`` sets unlike the zygote's."""
        base = self.base_env()
        return sorted(k for k in (set(env) | set(base)) - PER_RUN_ENV if env.get(k) != base.get(k))

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a run with the environment ``env`` may fork from the zygote."""
        if self.off:
            self.counts["plain: zygote off"] += 1
            return False
        if differ := self.differ(env):
            reason = f"plain: the environment sets {', '.join(differ)}"
            if not self.counts[reason]:
                logging.getLogger(__name__).warning("a CLI run in a plain subprocess: %s", reason)
            self.counts[reason] += 1
        return not differ

    def summary(self) -> str:
        """``N forked, M plain (reason: count; ...)``."""
        plain = {k: n for k, n in self.counts.items() if k != "forked"}
        reasons = "; ".join(f"{k.removeprefix('plain: ')}: {n}" for k, n in sorted(plain.items()))
        return f"{self.counts['forked']} forked, {sum(plain.values())} plain" + (
            f" ({reasons})" if reasons else ""
        )

    def run(
        self, args: Sequence[str], timeout: float, cwd: Path, env: dict[str, str]
    ) -> subprocess.CompletedProcess[str] | None:
        """The forked run's result (``subprocess.TimeoutExpired`` past ``timeout``), or None."""
        if not self.serves(env):
            return None
        if not self._busy.acquire(blocking=False):
            self.counts["plain: another run holds the zygote"] += 1
            return None
        try:
            self.counts["forked"] += 1
            return self._run(args, timeout, cwd, env)
        except (KeyError, OSError, RuntimeError, TimeoutError, ValueError):
            self._stop()  # out of step with the zygote: no more forks this session
            self.off = True
            raise
        finally:
            self._busy.release()

    def _answer(self, deadline: float) -> dict[str, Any]:
        """The zygote's next answer line (read from its pipe's fd: no buffer hides a line)."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("the tests' zygote did not answer")
            chunk = os.read(fd, 65536)
            if not chunk:
                log = self._log.read_text()[-4000:]
                raise RuntimeError(f"the tests' zygote exited ({self._proc.wait()}): {log}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def _start(self) -> None:
        fd, log = tempfile.mkstemp(prefix="evolm-zygote-", suffix=".log")
        self._log, self._buf = Path(log), b""
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=fd,
            cwd=REPO,
            env=self.base_env(),
        )
        os.close(fd)
        atexit.register(self._stop)
        self._answer(time.monotonic() + 300)  # {"ready": pid}: the imports done

    def _stop(self) -> None:
        """End the zygote: its stdin closed ends its loop; killed if it does not."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self._log.unlink(missing_ok=True)

    def _run(
        self, args: Sequence[str], timeout: float, cwd: Path, env: dict[str, str]
    ) -> subprocess.CompletedProcess[str]:
        if self._proc is None:
            self._start()
        assert self._proc is not None and self._proc.stdin is not None
        command = [sys.executable, "-m", "evolm", *args]
        with tempfile.TemporaryDirectory(prefix="evolm-cli-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"argv": list(args), "cwd": str(cwd), "env": env}
            line = json.dumps({**request, "stdout": str(out), "stderr": str(err)}) + "\n"
            self._proc.stdin.write(line.encode())
            self._proc.stdin.flush()
            deadline = time.monotonic() + timeout
            pid = self.last_pid = self._answer(time.monotonic() + 60)["pid"]
            try:
                code = self._answer(deadline)["returncode"]
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    os.kill(pid, signal.SIGKILL)
                self._answer(time.monotonic() + 60)  # its return code: in step again
                raise subprocess.TimeoutExpired(
                    command, timeout, out.read_bytes(), err.read_bytes()
                ) from None
            return subprocess.CompletedProcess(command, code, out.read_text(), err.read_text())


ZYGOTE = Zygote()


def read_results(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]


def gloo_env(rank: int, world: int, port: int) -> dict[str, str]:
    """The launch variables of rank ``rank`` of ``world`` on 127.0.0.1, gloo backend (CPU)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "EVOLM_DIST_BACKEND": "gloo",
    }


def env_without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """``run_cli`` env in which ``modules`` cannot be imported (what an install without them
    sees): a ``sitecustomize`` on ``PYTHONPATH`` sets ``sys.modules[name] = None``."""
    hide = tmp_path / "hide"
    hide.mkdir(exist_ok=True)
    lines = ["import sys", *(f"sys.modules[{m!r}] = None" for m in modules)]
    (hide / "sitecustomize.py").write_text("\n".join(lines) + "\n")
    return {"PYTHONPATH": f"{hide}:{REPO}"}


def generation_record(
    generation: int,
    fitness_mean: float = 0.0,
    fitness_std: float = 0.0,
    update_norm: float = 0.1,
    diagnostics: dict[str, float] | None = None,
    nonfinite: int = 0,
) -> GenerationRecord:
    """The typed record a callback gets after a generation (fitness summaries all
    ``fitness_mean``: a callback reads the mean and std), as :class:`evolm.loop.ESLoop` emits."""
    es = TellStats(
        fitness_mean=fitness_mean,
        fitness_std=fitness_std,
        fitness_min=fitness_mean,
        fitness_max=fitness_mean,
        fitness_p20=fitness_mean,
        fitness_p80=fitness_mean,
        fitness_nonfinite=nonfinite,
        update_norm=update_norm,
        mean_norm=1.0,
    )
    return GenerationRecord(generation, es, diagnostics=diagnostics or {})


def check_stop_strings(
    engine: Any, population: Any, prompts: Sequence[str], reference: Any = None
) -> None:
    """``engine`` with stop strings returns its own plain completions cut after the first stop
    string (``cut_at_stop``), ``stopped`` where cut, some rows stopped and some not (stop
    strings from the second words of the plain completions); and, given a ``reference`` engine
    that computes the same numbers (the SGLang stand-in's LocalEngine), exactly its texts."""
    from evolm.sampling import Sampling, cut_at_stop

    plain = engine.generate(prompts, population, Sampling(16), 0)
    flat = [str(t) for m in plain for t in m]
    words = sorted({t.split()[1] for t in flat if len(t.split()) > 2})
    stop = tuple(w for w in words if sum(w in t for t in flat) < len(flat))[:2]
    assert stop, f"no stop string held by some completions only: {flat}"
    sampling = Sampling(16, stop=stop)
    got = engine.generate(prompts, population, sampling, 0)
    cut = [[cut_at_stop(str(t), stop) for t in m] for m in plain]
    assert [[str(t) for t in m] for m in got] == [[text for text, _ in m] for m in cut]
    flags = [[t.stopped for t in m] for m in got]
    assert flags == [[hit for _, hit in m] for m in cut] and any(map(any, flags))
    if reference is not None:
        want = reference.generate(prompts, population, sampling, 0)
        assert [[str(t) for t in m] for m in got] == [[str(t) for t in m] for m in want]
