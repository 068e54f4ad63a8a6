"""``server=sglang`` against the SGLang stand-in (``evolm.testing.sglang_standin``, CPU).

The stand-in enforces SGLang 0.5.x's HTTP contract (serving.md) and generates with the real
LocalEngine, so SGLangEngine's outputs must equal the LocalEngine's for the same adapters.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import torch
from transformers import AutoConfig

from evolm.engine.base import Engine
from evolm.engine.local import LocalEngine
from evolm.errors import ConfigError
from evolm.es import ES
from evolm.loop import ESLoop
from evolm.lora import LoraLayout, LoraPopulation, LoraSpec, save_adapter
from evolm.sampling import Sampling
from evolm.server.connection import ServerProcess, StartupError, free_port
from evolm.server.options import RemoteOptions
from evolm.server.remote import ServerDown
from evolm.server.sglang import SGLangEngine
from evolm.server.staging import adapter_root
from evolm.task.conciseness import Conciseness
from tests.helpers import check_stop_strings

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[1]
STANDIN = "evolm.testing.sglang_standin"


def attach(url: str) -> RemoteOptions:
    """Options that attach to the server at ``url``."""
    return RemoteOptions(STANDIN, url=url)


QV = ("q_proj", "v_proj")
PROMPTS = ["Solve: 3 + 5 =", "Is the sky blue?", "Name three colours of the rainbow."]


def make_layout(
    model_dir: str, rank: int = 2, modules: tuple[str, ...] | None = None
) -> LoraLayout:
    spec = LoraSpec(rank=rank) if modules is None else LoraSpec(rank=rank, target_modules=modules)
    return LoraLayout.from_hf_config(AutoConfig.from_pretrained(model_dir), spec)


def population(layout: LoraLayout, members: int, seed: int = 3) -> LoraPopulation:
    strategy = ES(population_size=members, sigma=0.3)
    state = strategy.init([torch.zeros(s) for s in layout.shapes()], seed=seed)
    return LoraPopulation(layout, tuple(strategy.sample(state, strategy.ask(state))))


def adapter(layout: LoraLayout, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) * 0.3 for shape in layout.shapes()]


class Recorder(Engine):
    """An Engine that records what the wrapped engine generated."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.outputs = engine, []

    def format_chat(self, messages: Any) -> str:
        return self.engine.format_chat(messages)

    def generate_rows(self, *args: Any) -> list[str]:
        return self.engine.generate_rows(*args)

    def generate(self, *args: Any) -> list[list[str]]:  # what the loop's evaluate calls
        self.outputs.append(self.engine.generate(*args))
        return self.outputs[-1]

    def close(self) -> None: ...


def es_generation(engine: Any, layout: LoraLayout) -> tuple[Any, dict[str, Any], list[Any]]:
    """One full ES generation (ask, evaluate 4 members, tell); returns state, record, outputs.
    The members alone (``train_mean=False``): what the engines are compared on (tests/near_tie.py
    rebuilds each member's adapter)."""
    strategy = ES(population_size=4, sigma=0.3)
    task = Conciseness(max_new_tokens=16)
    recorder = Recorder(engine)
    loop = ESLoop(strategy, task, recorder, layout, 1, 1, 0, train_mean=False)
    spec = LoraSpec(rank=layout.rank, init="random")
    mean = layout.init_mean(spec, [1.0] * len(layout.shapes()), seed=1)
    state, record = loop.step(strategy.init(mean, seed=0))
    return state, record.as_record(), recorder.outputs  # the flat record, as results.jsonl


@pytest.fixture(scope="module")
def layout(tiny_model_dir: str) -> LoraLayout:
    return make_layout(tiny_model_dir)


@pytest.fixture(scope="module")
def local(tiny_model_dir: str, layout: LoraLayout) -> LocalEngine:
    return LocalEngine(tiny_model_dir, layout, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def engine(tiny_model_dir: str, layout: LoraLayout) -> Iterator[SGLangEngine]:
    """The stand-in launched by the engine itself (5 slots: 4 members + base in one batch)."""
    options = RemoteOptions(STANDIN, startup_timeout_s=120)
    eng = SGLangEngine(tiny_model_dir, layout, options, max_loras_per_batch=5)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def narrow_url(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A stand-in started by hand: rank 2, q_proj and v_proj only, 3 slots."""
    port = free_port()
    cmd = [sys.executable, "-m", STANDIN, "--model-path", tiny_model_dir, "--port", str(port)]
    cmd += ["--enable-lora", "--max-lora-rank", "2", "--lora-target-modules", *QV]
    cmd += ["--max-loras-per-batch", "3"]
    server = ServerProcess(cmd, os.environ, tmp_path_factory.mktemp("narrow") / "server.log")
    url = f"http://127.0.0.1:{port}"
    try:
        server.wait_ready(lambda: _healthy(url), 120, "the stand-in")
        yield url
    finally:
        server.stop()


def _healthy(url: str) -> bool:
    try:
        return requests.get(url + "/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def test_es_generation_equals_local_engine(engine: SGLangEngine, local: LocalEngine) -> None:
    state, record, outputs = es_generation(engine, engine.layout)
    ref_state, ref_record, ref_outputs = es_generation(local, engine.layout)
    assert outputs == ref_outputs and len(outputs[0]) == 4
    assert len({tuple(m) for m in outputs[0]}) > 1, "members should differ"
    assert record["train/fitness_mean"] == ref_record["train/fitness_mean"]
    # SGLang's meta_info (token count, finish reason) gives the local engine's diagnostics
    said = ("train/completion_tokens", "train/truncated_share", "train/distinct_per_prompt")
    assert {k: record[k] for k in said} == {k: ref_record[k] for k in said}
    assert all(torch.equal(a, b) for a, b in zip(state.mean, ref_state.mean, strict=True))
    t = engine.last_timings
    assert set(t) >= {"write_s", "load_s", "build_s", "generate_s", "unload_s", "overhead_s"}
    assert requests.get(engine.url + "/v1/models").json()["data"][1:] == [], "all unloaded"
    assert not any(engine.stage.root.glob("g*/m*")), "adapter files removed"


def test_stop_strings_equal_local_engine(engine: SGLangEngine, local: LocalEngine) -> None:
    """The client sends ``stop`` with ``no_stop_trim`` and cuts as the local engine does: the
    same texts and ``stopped`` flags; the raw contract: SGLang drops the matched stop string
    from the text unless ``no_stop_trim``, and names it in ``finish_reason.matched``."""
    check_stop_strings(engine, population(engine.layout, 4), PROMPTS, reference=local)
    bases = local.generate(PROMPTS, None, Sampling(16), 0)[0]
    prompt, base = max(zip(PROMPTS, bases, strict=True), key=lambda p: len(p[1]))
    word = base[len(base) // 2 :][:3]  # a stop string that this base completion holds
    cut = base[: base.index(word) + len(word)]
    for trim, text in ((False, cut), (True, cut[: -len(word)])):
        params = {"max_new_tokens": 16, "temperature": 0, "stop": word, "no_stop_trim": not trim}
        answer = requests.post(
            engine.url + "/generate", json={"text": prompt, "sampling_params": params}
        ).json()
        assert answer["text"] == text
        assert answer["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}


def test_names_are_unique_per_generation(engine: SGLangEngine) -> None:
    seen: list[str] = []
    original = engine.load
    engine.load = lambda name, path: (seen.append(name), original(name, path))[1]  # type: ignore[method-assign]
    try:
        for _ in range(2):
            engine.generate(PROMPTS, population(engine.layout, 2), Sampling(4), seed=0)
    finally:
        del engine.load
    assert len(set(seen)) == 4 and all(n.startswith(engine.run + "-g") for n in seen)


def test_contract_violations_are_400(engine: SGLangEngine, tmp_path: Path) -> None:
    url, layout = engine.url, engine.layout
    paths = [
        save_adapter(tmp_path / f"a{i}", layout, adapter(layout, seed=i), "m") for i in range(5)
    ]
    names = [f"contract-{i}" for i in range(5)]

    def post(path: str, body: dict[str, Any]) -> requests.Response:
        return requests.post(url + path, json=body, timeout=60)

    try:
        for name, path in zip(names, paths, strict=True):
            ok = post("/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
            assert ok.status_code == 200 and ok.json()["success"], ok.text
        dup = post("/load_lora_adapter", {"lora_name": names[0], "lora_path": str(paths[0])})
        assert dup.status_code == 400 and not dup.json()["success"]
        bad = post("/load_lora_adapter", {"lora_name": "x", "lora_path": str(tmp_path / "none")})
        assert bad.status_code == 400
        listed = [m["id"] for m in requests.get(url + "/v1/models").json()["data"]]
        assert set(names) <= set(listed)
        params = {"max_new_tokens": 2, "temperature": 0}
        full = {"text": ["hi"] * 5, "lora_path": names, "sampling_params": params}
        assert post("/generate", full).status_code == 200  # 5 adapters in 5 slots
        plus_base = {**full, "text": ["hi"] * 6, "lora_path": [*names, None]}
        assert post("/generate", plus_base).status_code == 400  # base needs a sixth slot
        unknown = {"text": ["hi"], "lora_path": ["never-loaded"], "sampling_params": params}
        assert post("/generate", unknown).status_code == 400
        assert post("/unload_lora_adapter", {"lora_name": "never-loaded"}).status_code == 400
    finally:
        for name in names:
            post("/unload_lora_adapter", {"lora_name": name})


def test_mixed_ranks_in_one_request_match_each_alone(engine: SGLangEngine, tmp_path: Path) -> None:
    """The stand-in zero-pads a rank-1 adapter beside a rank-2 one (and folds alpha / r)."""
    url, model = engine.url, engine.model_path
    names = ["mixed-r1", "mixed-r2"]
    for name, rank, alpha in (("mixed-r1", 1, 4.0), ("mixed-r2", 2, 8.0)):
        spec = LoraSpec(rank=rank, alpha=alpha)
        layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(model), spec)
        path = save_adapter(tmp_path / name, layout, adapter(layout, seed=rank), model)
        body = {"lora_name": name, "lora_path": str(path)}
        assert requests.post(url + "/load_lora_adapter", json=body, timeout=60).ok
    params = {"max_new_tokens": 8, "temperature": 0}

    def generate(lora: list[str]) -> list[str]:
        body = {"text": PROMPTS * len(lora), "lora_path": [n for n in lora for _ in PROMPTS]}
        answer = requests.post(url + "/generate", json={**body, "sampling_params": params})
        return [row["text"] for row in answer.json()]

    try:
        assert generate(names) == generate(names[:1]) + generate(names[1:])
    finally:
        for name in names:
            requests.post(url + "/unload_lora_adapter", json={"lora_name": name}, timeout=60)


def test_server_refuses_adapters_it_cannot_serve(
    narrow_url: str, tiny_model_dir: str, tmp_path: Path
) -> None:
    for name, layout in (("rank4", make_layout(tiny_model_dir, 4, QV)),
                         ("allmods", make_layout(tiny_model_dir, 2))):  # fmt: skip
        path = save_adapter(tmp_path / name, layout, adapter(layout), "m")
        body = {"lora_name": name, "lora_path": str(path)}
        answer = requests.post(narrow_url + "/load_lora_adapter", json=body, timeout=60)
        assert answer.status_code == 400, answer.text


@pytest.mark.parametrize(
    ("rank", "modules", "slots", "key", "flag"),
    [
        (4, QV, 3, "max_lora_rank", "--max-lora-rank"),
        (2, None, 3, "lora_target_modules", "--lora-target-modules"),
        (2, QV, 8, "max_loras_per_batch", "--max-loras-per-batch"),
    ],
)
def test_validation_names_the_flag(
    narrow_url: str, tiny_model_dir: str, rank: int, modules: Any, slots: int, key: str, flag: str
) -> None:
    layout = make_layout(tiny_model_dir, rank, modules)
    with pytest.raises(ConfigError, match=rf"^{key}: .*{flag}") as err:
        SGLangEngine(tiny_model_dir, layout, attach(narrow_url), max_loras_per_batch=slots)
    assert narrow_url in str(err.value)


def test_startup_failure_shows_the_server_log(tiny_model_dir: str, layout: LoraLayout) -> None:
    with pytest.raises(
        StartupError, match=r"(?s)exited with code 2.*unrecognized arguments: --bogus"
    ):
        SGLangEngine(tiny_model_dir, layout, RemoteOptions(STANDIN, extra_args=["--bogus"]))


def test_config_errors_before_launch(tiny_model_dir: str, layout: LoraLayout) -> None:
    with pytest.raises(ConfigError, match=r"^max_loras_per_batch: "):
        SGLangEngine(tiny_model_dir, layout, RemoteOptions(STANDIN), max_loras_per_batch=1)
    with pytest.raises(ConfigError, match=r"^max_lora_rank: .*below lora.rank=2"):
        SGLangEngine(tiny_model_dir, layout, RemoteOptions(STANDIN), max_lora_rank=1)


def test_attached_population_in_waves_equals_local(narrow_url: str, tiny_model_dir: str) -> None:
    """4 members on 3 slots run as 2 requests of 2 members; same outputs as the local engine."""
    layout = make_layout(tiny_model_dir, 2, QV)
    pop, sampling = population(layout, 4), Sampling(max_new_tokens=12)
    engine = SGLangEngine(tiny_model_dir, layout, attach(narrow_url), max_loras_per_batch=3)
    try:
        rows = [(m, p) for m in "abcd" for p in range(len(PROMPTS))]
        calls = engine.build_calls([PROMPTS[p] for _, p in rows], [m for m, _ in rows], sampling, 0)
        assert [len(c.rows) for c in calls] == [2 * len(PROMPTS)] * 2
        assert {rows[i][0] for i in calls[1].rows} == {"c", "d"}
        out = engine.generate(PROMPTS, pop, sampling, seed=0)
    finally:
        engine.close()
    assert _healthy(narrow_url), "closing an attached engine leaves the server up"
    assert out == LocalEngine(tiny_model_dir, layout, device="cpu").generate(
        PROMPTS, pop, sampling, 0
    )


@pytest.mark.slow  # make test-all
def test_self_test_catches_a_server_that_ignores_adapters(
    tiny_model_dir: str, layout: LoraLayout
) -> None:
    with pytest.raises(RuntimeError, match=r"self-test failed.*ignores adapter weights"):
        SGLangEngine(
            tiny_model_dir, layout, RemoteOptions(STANDIN, extra_args=["--ignore-adapters"])
        )


@pytest.mark.slow  # make test-all
def test_killed_server_is_restarted_and_nothing_lost(
    engine: SGLangEngine, local: LocalEngine
) -> None:
    pop, sampling = population(engine.layout, 4), Sampling(max_new_tokens=12)
    assert engine.process is not None
    old_pid, original = engine.process.pid, engine.build_calls

    def kill_then_build(*args: Any) -> Any:
        del engine.build_calls  # kill once: the re-run builds normally
        os.kill(engine.process.pid, signal.SIGKILL)
        engine.process.popen.wait(timeout=30)
        return original(*args)

    engine.build_calls = kill_then_build  # type: ignore[method-assign]
    out = engine.generate(PROMPTS, pop, sampling, seed=0)
    assert engine.process.pid != old_pid and engine.process.alive()
    assert out == local.generate(PROMPTS, pop, sampling, 0)


def test_keep_alive_then_attach_and_a_dead_attached_server_is_an_error(
    tiny_model_dir: str, layout: LoraLayout
) -> None:
    first = SGLangEngine(tiny_model_dir, layout, RemoteOptions(STANDIN, keep_alive=True))
    server = first.process
    assert server is not None
    try:
        first.close()
        assert server.alive(), "keep_alive leaves the server running"
        again = RemoteOptions(STANDIN, url=first.url, self_test=False, retries=1)
        second = SGLangEngine(tiny_model_dir, layout, again)
        assert second.generate(PROMPTS, None, Sampling(4), seed=0)
        server.stop()
        with pytest.raises(ServerDown, match=r"server\.url"):
            second.generate(PROMPTS, None, Sampling(4), seed=0)
        second.close()
    finally:
        server.stop()
        server.log_path.unlink(missing_ok=True)


def test_cli_run_attached_to_a_launcher_started_server(tiny_model_dir: str, tmp_path: Path) -> None:
    """launchers/sglang_server.sh (with the stand-in) + ``python -m evolm server=sglang``."""
    port = free_port()
    env = {**os.environ, "MODULE": STANDIN, "PYTHON": sys.executable, "MODEL": tiny_model_dir}
    env |= {"PORT": str(port), "MAX_LORA_RANK": "4", "MAX_LORAS_PER_BATCH": "5"}
    server = ServerProcess(
        ["bash", str(REPO / "launchers/sglang_server.sh")], env, tmp_path / "s.log"
    )
    url = f"http://127.0.0.1:{port}"
    try:
        server.wait_ready(lambda: _healthy(url), 120, "the launcher's stand-in")
        out = tmp_path / "run"
        cmd = [sys.executable, "-m", "evolm", "server=sglang", f"server.url={url}"]
        cmd += ["generations=2", "eval_every=1", "es.population_size=4", "task.max_new_tokens=8"]
        cmd += ["server.max_loras_per_batch=5", f"output_dir={out}", f"hydra.run.dir={out}"]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert len((out / "results.jsonl").read_text().splitlines()) == 3  # start + 2 generations
        assert _healthy(url), "an attached run leaves the server up"
    finally:
        server.stop()


@pytest.mark.slow  # make test-all (CI: test_interrupt's SIGTERM, the stand-in's CLI run)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_interrupted_run_leaves_no_server_and_no_adapters(
    tiny_model_dir: str, tmp_path: Path, sig: signal.Signals
) -> None:
    """Ctrl-C or SIGTERM during ``python -m evolm server=sglang``: evolm cleans up. SIGKILL: the
    server dies with evolm (PR_SET_PDEATHSIG), the next engine removes the adapter folder."""
    out, log_path = tmp_path / "run", tmp_path / "cli.log"
    cmd = [sys.executable, "-m", "evolm", "server=sglang", f"server.launch_module={STANDIN}"]
    cmd += ["generations=100000", "eval_every=100000", "es.population_size=4"]
    cmd += ["server.max_loras_per_batch=5", f"output_dir={out}", f"hydra.run.dir={out}"]
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}  # SIGABRT dumps every thread's stack
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        for _ in range(1200):  # the run starts within 120 s
            if "ES over" in log_path.read_text():
                break
            assert proc.poll() is None, log_path.read_text()[-3000:]
            time.sleep(0.1)
        time.sleep(1.5)  # some generations in
        proc.send_signal(sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            proc.wait(timeout=10)
            pytest.fail(f"still running 60 s after {sig!r}:\n" + log_path.read_text()[-5000:])
    finally:
        proc.kill()
    text = log_path.read_text()
    server_pid = int(re.search(r"launched pid (\d+)", text).group(1))  # type: ignore[union-attr]
    for _ in range(200):  # the server gets SIGTERM; give it 20 s to go
        if _gone(server_pid):
            break
        time.sleep(0.1)
    assert _gone(server_pid), f"server {server_pid} still runs after {sig!r}:\n{text[-3000:]}"
    folder = Path(f"/dev/shm/evolm-{proc.pid}")
    if sig == signal.SIGKILL:
        adapter_root("next-engine")
        Path(re.search(r"\(log: (\S+)\)", text).group(1)).unlink()  # type: ignore[union-attr]
    else:
        assert "stopped server pid" in text
    assert not folder.exists(), sorted(p.name for p in folder.rglob("*"))


def _gone(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split(")")[-1].split()[0] == "Z"


def test_adapters_are_written_in_the_servers_dtype(tiny_model_dir: str) -> None:
    """A bf16 server gets bf16 adapter files (half the bytes of fp32 to write and to load)."""
    from safetensors import safe_open

    from evolm.server.staging import AdapterStage

    layout = make_layout(tiny_model_dir)
    stage = AdapterStage("dtypetest", tiny_model_dir, torch.bfloat16)
    try:
        paths = stage.write(1, population(layout, 2), lambda fn, items: [fn(*i) for i in items])
        files = sorted(Path(paths[0]).glob("*.safetensors"))
        assert files
        with safe_open(str(files[0]), "pt") as f:
            dtypes = {f.get_tensor(k).dtype for k in f.keys()}  # noqa: SIM118
        assert dtypes == {torch.bfloat16}
    finally:
        stage.close()
