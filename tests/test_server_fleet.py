"""``server=sglang`` over several servers (one per GPU): a Fleet of two SGLang stand-ins (CPU).

The stand-in generates with the real LocalEngine, so the fleet's sharded rows must equal one
LocalEngine's whole-population output; a killed server is restarted by its own engine.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from evolm.app import pool
from evolm.engine.local import LocalEngine
from evolm.errors import ConfigError
from evolm.lora import LoraLayout
from evolm.sampling import Sampling
from evolm.server.connection import ServerProcess
from evolm.server.fleet import Fleet
from evolm.server.options import RemoteOptions
from evolm.server.sglang import SGLangEngine, sglang_servers
from tests.test_server_sglang import PROMPTS, STANDIN, make_layout, population

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def layout(tiny_model_dir: str) -> LoraLayout:
    return make_layout(tiny_model_dir)


@pytest.fixture(scope="module")
def fleet(tiny_model_dir: str, layout: LoraLayout) -> Iterator[Fleet]:
    """Two stand-ins launched at once, one per (would-be) GPU, as server.cuda_devices=[0,1]."""
    options = RemoteOptions(STANDIN, cuda_devices=["0", "1"], startup_timeout_s=120)
    engine = sglang_servers(tiny_model_dir, layout, options, max_loras_per_batch=6, max_lora_rank=4)
    assert isinstance(engine, Fleet)
    yield engine
    engine.close()


def test_fleet_rows_equal_one_local_engine(
    fleet: Fleet, tiny_model_dir: str, layout: LoraLayout
) -> None:
    servers = fleet.engines
    assert len(servers) == 2 and len({s.url for s in servers}) == 2  # type: ignore[attr-defined]
    envs = [s.process.popen.args for s in servers]  # type: ignore[attr-defined]
    assert all("--model-path" in args for args in envs)
    local = LocalEngine(tiny_model_dir, layout, device="cpu", dtype="float32")
    pop, sampling = population(layout, 5), Sampling(max_new_tokens=10)
    out = fleet.generate(PROMPTS, pop, sampling, seed=0)
    assert out == local.generate(PROMPTS, pop, sampling, 0)
    assert fleet.last_timings["generate_s"] > 0
    # both servers answered (each got every member: 15 rows over 2 servers, 3 prompts)
    for server in servers:
        assert server.generation >= 3  # type: ignore[attr-defined]  (self-test: 2, then >= 1)


def test_each_server_gets_its_share_as_one_request(fleet: Fleet, layout: LoraLayout) -> None:
    """Interleaved rows give a server members that answer different prompts (5 members x 3
    prompts over 2 servers: server 0 has the even members' prompts 0 and 2, the odd members'
    prompt 1). Its share is still one staged generation and one ``/generate``: one request
    per set of members ran the sets one after another, each a fraction of a batch (4 x H100:
    11 s of a 25 s generation)."""
    pop, sampling = population(layout, 5), Sampling(max_new_tokens=4)
    sent: list[str] = []
    for engine in fleet.engines:
        server = engine.server  # type: ignore[attr-defined]
        original = server.request

        def spy(method: str, path: str, *args: Any, _orig: Any = original, _url: str = engine.url,
                **kwargs: Any) -> Any:  # fmt: skip
            if path == "/generate":
                sent.append(_url)
            return _orig(method, path, *args, **kwargs)

        server.request = spy
    before = [e.generation for e in fleet.engines]  # type: ignore[attr-defined]
    try:
        fleet.generate(PROMPTS, pop, sampling, seed=0)
    finally:
        for engine in fleet.engines:
            del engine.server.request  # type: ignore[attr-defined]
    after = [e.generation for e in fleet.engines]  # type: ignore[attr-defined]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1]
    assert sorted(sent) == sorted(e.url for e in fleet.engines)  # type: ignore[attr-defined]


def base_copies(fleet: Fleet) -> list[Path]:
    """The base-model folders the fleet's engines have written (in any engine's stage)."""
    return sorted(p for e in fleet.engines for p in e.stage.root.glob("base-*"))  # type: ignore[attr-defined]


def test_a_full_mode_update_reaches_every_server_at_once(
    fleet: Fleet, tiny_model_dir: str, layout: LoraLayout, tmp_path: Path
) -> None:
    """``es.mean=full`` on a fleet: the new base weights are written ONCE and every server loads
    that one folder (issue 40 item 5; before, each server wrote its own copy), the servers'
    loads run side by side, not one after another, the fleet then generates as the updated
    model does, the next update deletes the previous copy, and ``restore_base_weights`` points
    every server back at the model and deletes the last one."""
    import torch

    from evolm.model.full import save_model

    t = layout.targets[0]
    new = {f"{t.path}.weight": torch.full((t.out_features, t.in_features), 0.01)}
    spans: list[tuple[float, float]] = []
    loaded: list[Path] = []
    for engine in fleet.engines:
        original = engine._send_base  # type: ignore[attr-defined]

        def spy(path: Path, _orig: Any = original) -> None:
            start = time.monotonic()
            time.sleep(1.0)  # a load that takes a while, as a real model's does
            _orig(path)
            spans.append((start, time.monotonic()))
            loaded.append(path)

        engine._send_base = spy  # type: ignore[attr-defined]
    try:
        fleet.update_base_weights(new)
    finally:
        for engine in fleet.engines:
            del engine._send_base  # type: ignore[attr-defined]
    assert len(spans) == 2
    assert max(s for s, _ in spans) < min(e for _, e in spans), f"one after another: {spans}"
    [copy] = base_copies(fleet)  # one copy written, both servers loaded it
    assert loaded == [copy, copy]
    assert [e.base_path for e in fleet.engines] == [copy, copy]  # type: ignore[attr-defined]
    pop, sampling = population(layout, 3), Sampling(max_new_tokens=6)
    updated = LocalEngine(str(save_model(tmp_path / "m", tiny_model_dir, new)), layout,
                          device="cpu", dtype="float32")  # fmt: skip
    assert fleet.generate(PROMPTS, pop, sampling, 0) == updated.generate(PROMPTS, pop, sampling, 0)
    fleet.update_base_weights({k: v * 2 for k, v in new.items()})
    [second] = base_copies(fleet)
    assert second != copy and [e.base_path for e in fleet.engines] == [second, second]  # type: ignore[attr-defined]
    fleet.restore_base_weights()
    assert base_copies(fleet) == [] and [e.base_path for e in fleet.engines] == [None, None]  # type: ignore[attr-defined]
    base = LocalEngine(tiny_model_dir, layout, device="cpu", dtype="float32")
    assert fleet.generate(PROMPTS, pop, sampling, 0) == base.generate(PROMPTS, pop, sampling, 0)


def test_a_killed_server_is_restarted_by_its_own_watchdog(
    fleet: Fleet, tiny_model_dir: str, layout: LoraLayout
) -> None:
    victim: SGLangEngine = fleet.engines[1]  # type: ignore[assignment]
    assert victim.process is not None
    old = victim.process.pid
    os.kill(old, signal.SIGKILL)
    victim.process.popen.wait(timeout=30)
    pop, sampling = population(layout, 3), Sampling(max_new_tokens=6)
    out = fleet.generate(PROMPTS, pop, sampling, seed=0)
    assert victim.process.alive() and victim.process.pid != old
    local = LocalEngine(tiny_model_dir, layout, device="cpu", dtype="float32")
    assert out == local.generate(PROMPTS, pop, sampling, 0)


def test_a_sweep_keeps_the_fleet_and_repoints_every_server(
    fleet: Fleet, tiny_model_dir: str
) -> None:
    """The engine pool's second trial gets the same fleet (no new servers), every server on the
    new layout; a rank above the servers' --max-lora-rank names the key."""
    key = pool.engine_key(tiny_model_dir, {"cuda_devices": [0, 1]})
    p = pool.EnginePool()
    first = p.get(key, fleet.layout, lambda: fleet)
    wider = make_layout(tiny_model_dir, rank=4)
    second = p.get(key, wider, lambda: pytest.fail("a second fleet was started"))
    assert second is first and p.started == 1
    assert all(e.layout is wider for e in fleet.engines)
    with pytest.raises(ConfigError, match="max_lora_rank"):
        fleet.use_layout(make_layout(tiny_model_dir, rank=8))
    fleet.use_layout(make_layout(tiny_model_dir))
    p.engine = None  # the module fixture closes it


def test_attach_to_a_list_of_urls(fleet: Fleet, tiny_model_dir: str, layout: LoraLayout) -> None:
    urls = [e.url for e in fleet.engines]  # type: ignore[attr-defined]
    attached = sglang_servers(
        tiny_model_dir,
        layout,
        RemoteOptions(STANDIN, url=urls, self_test=False),
        max_loras_per_batch=6,
    )
    try:
        assert isinstance(attached, Fleet) and attached.urls == urls
        pop, sampling = population(layout, 2), Sampling(max_new_tokens=6)
        assert attached.generate(PROMPTS, pop, sampling, 0) == fleet.generate(
            PROMPTS, pop, sampling, 0
        )
    finally:
        attached.close()
    for url in urls:  # closing an attached fleet leaves the servers up
        assert requests.get(url + "/health", timeout=5).status_code == 200


def test_both_lists_or_an_empty_one_are_config_errors(
    tiny_model_dir: str, layout: LoraLayout, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"^cuda_devices: "):
        sglang_servers(
            tiny_model_dir, layout, RemoteOptions(STANDIN, url=["http://a:1"], cuda_devices=["0"])
        )
    with pytest.raises(ConfigError, match=r"^url: "):
        sglang_servers(tiny_model_dir, layout, RemoteOptions(STANDIN, url=[]))


def test_a_server_started_from_a_short_lived_thread_outlives_that_thread(tmp_path: Path) -> None:
    """The fleet starts its servers from a thread pool that ends once they are up. PR_SET_PDEATHSIG
    fires when the starting *thread* exits: every launched SGLang server got SIGTERM right after
    the fleet came up (seen on 4 x H100), and each run paid a second start-up."""
    started: list[ServerProcess] = []
    cmd = [sys.executable, "-c", "import time; time.sleep(120)"]

    def start_and_wait() -> None:  # as the fleet's thread does: start, then wait for health
        started.append(ServerProcess(cmd, os.environ, tmp_path / "s.log", die_with_parent=True))
        time.sleep(1.5)  # the child has run prctl(PR_SET_PDEATHSIG) by now

    thread = threading.Thread(target=start_and_wait)
    thread.start()
    thread.join()
    (server,) = started
    try:
        time.sleep(2.0)  # the SIGTERM came within milliseconds of the thread's end
        assert server.alive(), f"the server died with its starting thread: {server.popen.poll()}"
    finally:
        server.stop(grace_s=2.0)
    assert not server.alive()
