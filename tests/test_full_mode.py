"""es.mean=full: full-weight ES with low-rank members (evolm.es.lowrank) and its run."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from evolm.checkpoint import latest_checkpoint
from evolm.engine.local import LocalEngine
from evolm.errors import ConfigError
from evolm.es import ES
from evolm.es.lowrank import FullES, cosine
from evolm.lora import LoraLayout, LoraPopulation, LoraSpec
from evolm.sampling import Sampling
from tests.helpers import REPO, read_results, run_cli

SHAPES = [(24, 16), (16, 40), (40, 16)]


def full_es(rank: int = 4, **kw: object) -> FullES:
    es = ES(**{"population_size": 8, "sigma": 0.01, "alpha": 0.5, "mean": "full", **kw})
    names = tuple(f"w{k}.weight" for k in range(len(SHAPES)))
    return FullES.of(es, rank=rank, lora_scaling=2.0, names=names, chunk=3)


def weights(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen) * 0.05 for s in SHAPES]


@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("update", ["paper", "natural", "openai"])
def test_fold_in_equals_the_intended_update(antithetic: bool, update: str) -> None:
    """The fp32 master's change equals alpha * the dense sum of every member's perturbation
    (cosine >= 0.9999, in fact ~1 - 1e-12); the bf16 working copy's change is reported."""
    strat = full_es(antithetic=antithetic, update=update)
    state = strat.init(weights(), seed=3)
    before = [m.clone() for m in state.mean]
    pop = strat.ask(state)
    fitness = torch.randn(len(pop), generator=torch.Generator().manual_seed(1))
    intended = strat.intended_update(state, pop, fitness)
    new, stats = strat.tell(state, pop, fitness)
    change = [a - b for a, b in zip(new.mean, before, strict=True)]
    assert cosine(change, intended) >= 0.9999
    rel = math.sqrt(
        sum(float((c - i).double().norm() ** 2) for c, i in zip(change, intended, strict=True))
    )
    assert rel / math.sqrt(sum(float(i.norm() ** 2) for i in intended)) < 1e-5
    assert stats.update_norm == pytest.approx(
        math.sqrt(sum(float(i.norm() ** 2) for i in intended)), rel=1e-5
    )
    assert state.consumed and not new.consumed and new.generation == 1
    bf16 = [
        a.bfloat16().double() - b.bfloat16().double() for a, b in zip(new.mean, before, strict=True)
    ]
    assert 0 < cosine(bf16, intended) <= 1  # reported by launchers/full_mode_gpu.py


def test_members_are_the_perturbations_served_as_lora() -> None:
    """Member i's adapter (lora_scaling * B_i @ A_i) is sigma * sign_i * U V / sqrt(r), entries
    of std sigma; antithetic pairs mirror exactly; nothing is [N, out, in]."""
    strat = full_es(rank=4, antithetic=True, population_size=400, sigma=0.01)
    state = strat.init(weights(), seed=0)
    pop = strat.ask(state)
    factors = strat.sample(state, pop)
    assert [tuple(t.shape) for t in factors[:2]] == [(400, 4, 16), (400, 24, 4)]
    a, b = factors[0], factors[1]
    delta = strat.lora_scaling * b @ a  # [N, out, in] here only because the test is tiny
    assert torch.equal(delta[0], -delta[1])
    assert delta.std().item() == pytest.approx(0.01, rel=0.05)


def test_adam_and_weight_decay_match_lora_modes_rule() -> None:
    """Full mode steps with lora mode's optimiser (evolm.es.optim.ascend): Adam's first step
    moves each entry by about alpha in the direction's sign; decay shrinks the mean."""
    strat = full_es(optimizer="adam", alpha=0.001, antithetic=True)
    state = strat.init(weights(), seed=0)
    before = [m.clone() for m in state.mean]
    pop = strat.ask(state)
    fitness = torch.arange(len(pop), dtype=torch.float64)
    direction = [strat.direction(state, k, _weights(strat, pop, fitness)) for k in range(3)]
    new, _ = strat.tell(state, pop, fitness)
    assert new.opt["step"] == 1
    for m, b, d in zip(new.mean, before, direction, strict=True):
        torch.testing.assert_close(m - b, 0.001 * torch.sign(d), atol=2e-6, rtol=1e-3)


def _weights(strat: FullES, pop, fitness) -> dict[int, float]:  # type: ignore[no-untyped-def]
    from evolm.es.shaping import SHAPINGS

    out: dict[int, float] = {}
    for s, sign, z in zip(
        pop.seeds, pop.signs, SHAPINGS[strat.shaping](fitness).tolist(), strict=True
    ):
        out[s] = out.get(s, 0.0) + sign * z
    return out


def test_bad_mean_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"mean.*unknown 'bad'.*lora, full"):
        ES(mean="bad")


# -- runs through the real CLI on the tiny model ------------------------------------------------

FULL = [
    "es.mean=full",
    "logger=none",
    "callbacks.checkpoint.every=2",
    "callbacks.checkpoint.keep=2",
]
MODEL_FILE = Path("model") / "model.safetensors"


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: str) -> Path:
    """The default demo (conciseness, 40 generations of 16) in full mode, uninterrupted."""
    run_dir = tmp_path_factory.mktemp("full") / "run"
    proc = run_cli([*FULL, f"hydra.run.dir={run_dir}"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def test_demo_learns_in_full_mode(full_run: Path) -> None:
    """Held-out conciseness reward improves as in lora mode's test_default_demo_learns (the
    default es config: -57.1 -> -6.2 here); no KL is logged (the base is the mean)."""
    records = read_results(full_run)
    evals = [(r["generation"], r["eval/reward_mean"]) for r in records if "eval/reward_mean" in r]
    assert [g for g, _ in evals] == [0, 10, 20, 30, 40]
    assert evals[-1][1] >= evals[0][1] + 10.0, evals
    assert not any("eval/kl_mean" in r for r in records)
    train = [r for r in records if "es/update_norm" in r]
    assert all(r["es/update_rel"] > 0 and r["time/engine_base_update_s"] > 0 for r in train)
    assert not (full_run / "adapter").exists()


def test_exported_model_loads_in_transformers_with_the_engines_logits(
    full_run: Path, tiny_model_dir: str
) -> None:
    """<run>/model is a plain transformers directory (config, tokenizer, safetensors) that
    loads with no merge, and gives the logits of the engine whose base weights were set from
    the final fp32 master; the fast path, refreshed in place, generates what a fresh engine on
    the exported model generates."""
    model_dir = full_run / "model"
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= {
        p.name for p in model_dir.iterdir()
    }
    exported = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    master = latest_checkpoint(full_run / "checkpoints")
    assert master is not None and master.generation == 40
    layout = LoraLayout.from_hf_config(exported.config, LoraSpec())
    names = [f"{t.path}.weight" for t in layout.targets]
    engine = LocalEngine(tiny_model_dir, layout, device="cpu")
    assert engine.fast is not None
    prompts = ["Solve: 3 + 5 =", "What is the capital of France?"]
    sampling = Sampling(max_new_tokens=12, temperature=0.0)
    before = engine.generate(prompts, None, sampling, seed=0)  # graphs/buffers built first
    engine.update_base_weights(dict(zip(names, master.es["mean"], strict=True)))
    ids = tokenizer(prompts[0], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(engine.model(ids).logits, exported(ids).logits)
    after = engine.generate(prompts, None, sampling, seed=0)
    fresh = LocalEngine(str(model_dir), layout, device="cpu").generate(prompts, None, sampling, 0)
    assert after == fresh and after != before


@pytest.mark.slow  # make test-all (CI: the full-mode demo learns)
def test_killed_full_run_resumes_to_the_byte_identical_model(
    full_run: Path, tmp_path: Path
) -> None:
    """SIGKILLed after its first checkpoint and resumed, the run writes the same model file
    (byte for byte) and the same records as the uninterrupted run: the fp32 master is the
    state, and the engine's weights are set from it on resume."""
    run_dir = tmp_path / "killed"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    cmd = [sys.executable, "-m", "evolm", *FULL, f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        first = run_dir / "checkpoints" / "gen-000002.pt.sha256"
        deadline = time.monotonic() + 120
        while not first.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.002)
        time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (run_dir / MODEL_FILE).exists()
    resumed = run_cli([f"resume={run_dir}"], timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (run_dir / MODEL_FILE).read_bytes() == (full_run / MODEL_FILE).read_bytes()
    strip = lambda rs: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rs]  # noqa: E731
    assert strip(read_results(run_dir)) == strip(read_results(full_run))


@pytest.mark.slow  # make test-all
def test_full_mode_with_vllm_is_refused_before_any_model_loads(tmp_path: Path) -> None:
    proc = run_cli(
        ["es.mean=full", "server=vllm", f"hydra.run.dir={tmp_path / 'run'}"], timeout=120
    )
    assert proc.returncode != 0
    err = proc.stderr + proc.stdout
    assert "es.mean" in err and "server=vllm" in err and "es.mean=lora" in err, err[-2000:]
    assert "Traceback" not in err


def test_a_kl_objective_with_full_mode_is_refused_before_any_model_loads(tmp_path: Path) -> None:
    """Full mode logs no eval/kl_* (the base served is the mean): a sweep optimising it would
    train every trial to the end and then fail; refused at once, naming the key."""
    cache = tmp_path / "cache"  # empty: a model load would build the tiny model here
    proc = run_cli(
        ["es.mean=full", "optimized_metric=eval/kl_mean", f"hydra.run.dir={tmp_path / 'run'}"],
        timeout=120,
        env={"EVOLM_CACHE_DIR": str(cache)},
    )
    err = proc.stderr + proc.stdout
    assert proc.returncode != 0
    assert "optimized_metric" in err and "eval/kl_mean" in err and "es.mean=lora" in err, err[
        -2000:
    ]
    assert "Traceback" not in err
    assert not (cache / "models").exists(), "the error came after the model was looked for"


def test_bad_mean_on_the_command_line(tmp_path: Path) -> None:
    proc = run_cli(["es.mean=bad", f"hydra.run.dir={tmp_path / 'run'}"], timeout=120)
    assert proc.returncode != 0
    err = proc.stderr + proc.stdout
    assert "es.mean" in err and "'bad'" in err and "lora, full" in err, err[-2000:]


@pytest.mark.slow  # make test-all (CI: the full-mode demo learns)
def test_gpu_measurement_script_runs_on_cpu_at_a_tiny_shape(tmp_path: Path) -> None:
    """launchers/full_mode_gpu.py (the lead runs it on a GPU) writes its JSON: (a) the fp32
    master's cosine >= 0.9999 and the bf16 one reported, (b) no OOM, (c) fold-in shares."""
    out = tmp_path / "full.json"
    args = ["--device", "cpu", "--big-shape", "tiny", "--small-shape", "tiny", "--ranks", "1"]
    args += ["4", "--population", "16", "--fidelity-population", "8", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "launchers/full_mode_gpu.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for rank in ("rank1", "rank4"):
        assert result["fidelity"][rank]["cosine_master_fp32"] >= 0.9999
        assert 0 < result["fidelity"][rank]["cosine_working_bf16"] < 1
        assert result["memory"][rank]["oom"] is False
    assert {"pop16_rank1", "pop30_rank4"} <= result["fold_in_cost"].keys()
    assert all(0 < v["share_of_wreal"] < 1 for k, v in result["fold_in_cost"].items() if "pop" in k)


# -- server=sglang: /update_weights_from_disk (the stand-in enforces SGLang's contract) ---------

STANDIN = "evolm.testing.sglang_standin"
SHORT = ["generations=4", "eval_every=2", "es.population_size=4", "task.max_new_tokens=8"]


@pytest.mark.slow  # make test-all (CI: the full-mode demo learns)
def test_full_mode_on_sglang_equals_local(tmp_path: Path, tiny_model_dir: str) -> None:
    """server=sglang refreshes the served base through /update_weights_from_disk after every
    update: the run's records and final model equal server=local's, byte for byte (a server
    that kept its launch weights would score other members from generation 2 on)."""
    runs = {}
    for name, extra in (
        ("local", []),
        ("sglang", ["server=sglang", f"server.launch_module={STANDIN}"]),
    ):
        run_dir = tmp_path / name
        proc = run_cli([*SHORT, "es.mean=full", "logger=none", *extra, f"hydra.run.dir={run_dir}"])
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = run_dir
    strip = lambda rs: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rs]  # noqa: E731
    assert strip(read_results(runs["sglang"])) == strip(read_results(runs["local"]))
    model = (runs["sglang"] / MODEL_FILE).read_bytes()
    assert model == (runs["local"] / MODEL_FILE).read_bytes()


@pytest.mark.slow  # make test-all
def test_standin_enforces_update_weights_from_disk_contract(
    tmp_path: Path, tiny_model_dir: str
) -> None:
    """model_path required, only UpdateWeightFromDiskReqInput's fields, a folder with
    safetensors of the model's own tensors: else 400 and the served weights are unchanged."""
    from evolm.model.full import save_model
    from evolm.server.options import RemoteOptions
    from evolm.server.sglang import SGLangEngine

    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), LoraSpec())
    engine = SGLangEngine(tiny_model_dir, layout, RemoteOptions(STANDIN, startup_timeout_s=120))
    try:
        url = f"{engine.url}/update_weights_from_disk"
        prompts, sampling = ["Solve: 3 + 5 ="], Sampling(max_new_tokens=8)
        base = engine.generate(prompts, None, sampling, seed=0)
        for body in ({}, {"model_path": str(tmp_path)}, {"model_path": tiny_model_dir, "x": 1}):
            answer = requests.post(url, json=body, timeout=30)
            assert answer.status_code == 400, (body, answer.text)
        wrong = tmp_path / "wrong"
        wrong.mkdir()
        save_file(
            {"model.layers.0.mlp.up_proj.weight": torch.zeros(3, 3)}, str(wrong / "m.safetensors")
        )
        answer = requests.post(url, json={"model_path": str(wrong)}, timeout=30)
        assert answer.status_code == 400 and answer.json()["success"] is False
        assert engine.generate(prompts, None, sampling, seed=0) == base
        target = layout.targets[0]
        zero = {f"{target.path}.weight": torch.zeros(target.out_features, target.in_features)}
        new = save_model(tmp_path / "new", tiny_model_dir, zero)
        engine.update_base_weights(zero)
        assert engine.generate(prompts, None, sampling, seed=0) != base
        fresh = LocalEngine(str(new), layout, device="cpu")
        assert engine.generate(prompts, None, sampling, seed=0) == fresh.generate(
            prompts, None, sampling, 0
        )
    finally:
        engine.close()


def sglang_engine(model_dir: str, **options: object):  # type: ignore[no-untyped-def]
    """An SGLangEngine on the stand-in (no self-test) and its LoRA layout."""
    from evolm.server.options import RemoteOptions
    from evolm.server.sglang import SGLangEngine

    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(model_dir), LoraSpec())
    opts = RemoteOptions(STANDIN, startup_timeout_s=120, self_test=False, **options)  # type: ignore[arg-type]
    return SGLangEngine(model_dir, layout, opts), layout


def base_update(layout: LoraLayout, value: float) -> dict[str, torch.Tensor]:
    """New base weights: the first target module's weight filled with ``value``."""
    t = layout.targets[0]
    return {f"{t.path}.weight": torch.full((t.out_features, t.in_features), value)}


def served_as(engine, model_dir: Path | str, layout: LoraLayout) -> bool:  # type: ignore[no-untyped-def]
    """Does the server generate as the model in ``model_dir`` does?"""
    prompts, sampling = ["Solve: 3 + 5 =", "Hi"], Sampling(max_new_tokens=8)
    fresh = LocalEngine(str(model_dir), layout, device="cpu", dtype="float32")
    return engine.generate(prompts, None, sampling, 0) == fresh.generate(prompts, None, sampling, 0)


def base_folders(engine) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(p.name for p in engine.stage.root.glob("base-*"))


def test_sglang_failed_base_update_leaves_no_model_copy(
    tmp_path: Path, tiny_model_dir: str
) -> None:
    """A refused update deletes its folder and the server keeps the previous weights; the next
    success deletes the previous success's folder: one model copy in /dev/shm at most."""
    from evolm.model.full import save_model

    engine, layout = sglang_engine(tiny_model_dir)
    try:
        first = base_update(layout, 0.01)
        engine.update_base_weights(first)
        assert base_folders(engine) == ["base-000001"]
        t = layout.targets[0]
        wrong = {f"{t.path}.weight": torch.zeros(3, 3)}  # not the model's shape: SGLang refuses
        with pytest.raises(RuntimeError, match="could not load the base weights"):
            engine.update_base_weights(wrong)
        assert base_folders(engine) == ["base-000001"]
        assert served_as(engine, save_model(tmp_path / "first", tiny_model_dir, first), layout)
        engine.update_base_weights(base_update(layout, -0.01))
        assert base_folders(engine) == ["base-000003"]
    finally:
        engine.close()


@pytest.mark.slow  # make test-all (CI: the full-mode demo learns)
def test_sglang_base_update_restarts_a_killed_server(tmp_path: Path, tiny_model_dir: str) -> None:
    """A launched server that died is restarted, and the new base weights are loaded into it."""
    from evolm.model.full import save_model

    engine, layout = sglang_engine(tiny_model_dir, retries=0)
    try:
        engine.update_base_weights(base_update(layout, 0.01))
        assert engine.process is not None
        old_pid = engine.process.pid
        os.kill(old_pid, signal.SIGKILL)
        engine.process.popen.wait(timeout=30)
        second = base_update(layout, -0.01)
        engine.update_base_weights(second)
        assert engine.process.pid != old_pid and engine.process.alive()
        assert base_folders(engine) == ["base-000002"]
        assert served_as(engine, save_model(tmp_path / "second", tiny_model_dir, second), layout)
    finally:
        engine.close()


def test_sglang_attached_server_with_a_full_runs_weights_is_refused(tiny_model_dir: str) -> None:
    """A kept-alive server that still serves a full run's ES mean: attaching to it is a
    ConfigError naming its URL, what it serves and the fix; restore_base_weights points it back
    at the model's own folder, and then attaching works and generates as the model does."""
    first, layout = sglang_engine(tiny_model_dir, keep_alive=True)
    server = first.process
    assert server is not None
    try:
        first.update_base_weights(base_update(layout, 0.01))
        served = str(first.base_path)
        with pytest.raises(ConfigError) as caught:
            sglang_engine(tiny_model_dir, url=first.url)
        message = str(caught.value)
        assert first.url in message and served in message
        assert "restart that server" in message and "update_weights_from_disk" in message
        first.restore_base_weights()
        assert first.base_path is None and base_folders(first) == []
        second, _ = sglang_engine(tiny_model_dir, url=first.url)
        try:
            assert served_as(second, tiny_model_dir, layout)
        finally:
            second.close()
    finally:
        first.close()
        server.stop()
        server.log_path.unlink(missing_ok=True)


def test_sglang_kept_alive_server_serves_the_model_again_after_close(tiny_model_dir: str) -> None:
    """close() points a server that outlives the engine back at the model's own folder (the
    updated folders are deleted): the next run attaches and generates as the model does."""
    first, layout = sglang_engine(tiny_model_dir, keep_alive=True)
    server = first.process
    assert server is not None
    try:
        first.update_base_weights(base_update(layout, 0.01))
        first.close()
        assert server.alive()
        second, _ = sglang_engine(tiny_model_dir, url=first.url)
        try:
            assert served_as(second, tiny_model_dir, layout)
        finally:
            second.close()
    finally:
        server.stop()
        server.log_path.unlink(missing_ok=True)


def test_export_of_a_full_run_points_at_its_model(full_run: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "evolm.export", str(full_run)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "already a plain transformers model" in proc.stderr


def test_update_base_weights_refreshes_fused_and_fp8_weights_in_place(tiny_model_dir: str) -> None:
    """The fast path's fused buffer holds the new weight (the same storage: CUDA graphs over it
    stay valid), its fp8 copy is requantized in place, and an unknown name is an error."""
    from evolm.engine.fast.fp8 import Fp8Weight

    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), LoraSpec())
    engine = LocalEngine(tiny_model_dir, layout, device="cpu", quantization="fp8")
    assert engine.fast is not None
    qkv = engine.fast.scheduler.model.layers[0].qkv
    q = layout.targets[0]
    assert q.path.endswith("0.self_attn.q_proj")
    ptrs = (qkv.weight.data_ptr(), qkv.fp8.weight.data_ptr(), qkv.fp8.scale.data_ptr())
    new = torch.randn(q.out_features, q.in_features, generator=torch.Generator().manual_seed(0))
    engine.update_base_weights({f"{q.path}.weight": new})
    assert (qkv.weight.data_ptr(), qkv.fp8.weight.data_ptr(), qkv.fp8.scale.data_ptr()) == ptrs
    assert torch.equal(qkv.weight[: q.out_features], new)
    fresh = Fp8Weight.quantize(qkv.weight[: qkv.out])
    assert torch.equal(qkv.fp8.weight.float(), fresh.weight.float())
    assert torch.equal(qkv.fp8.scale, fresh.scale)
    with pytest.raises(AttributeError):
        engine.update_base_weights({"model.layers.0.self_attn.nope.weight": new})


def test_interrupt_after_an_in_place_fold_saves_no_mislabelled_checkpoint(tmp_path: Path) -> None:
    """A stop after FullES.tell moved generation g's tensors to g+1 (before g+1 is emitted)
    must not checkpoint them as generation g: the last periodic checkpoint stays the newest."""
    from evolm.callbacks import GenerationRecord, RunContext
    from evolm.callbacks.checkpoint import Checkpointer
    from evolm.checkpoint import checkpoints
    from evolm.interrupt import Interrupted

    strat = full_es()
    state = strat.init(weights(), seed=0)
    ctx = RunContext(tmp_path, 10, LoraLayout((), 1, 1.0, 1), "base")
    saver = Checkpointer(every=5, keep=2)
    saver.on_run_start(ctx, state)
    for g in (1, 2):
        pop = strat.ask(state)
        state, _ = strat.tell(state, pop, torch.randn(len(pop)))
        saver.on_generation_end(ctx, GenerationRecord(generation=g), state)
    pop = strat.ask(state)
    strat.tell(state, pop, torch.randn(len(pop)))  # generation 3's fold: state 2 is consumed
    saver.on_run_error(ctx, Interrupted(signal.SIGTERM))
    assert checkpoints(tmp_path / "checkpoints") == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the lead runs it)")
def test_cuda_graphs_see_updated_base_weights(tmp_path: Path, tiny_model_dir: str) -> None:
    """On a GPU (bf16, CUDA graphs captured by a first generation), update_base_weights changes
    what the captured graphs compute: greedy outputs equal a fresh engine's on the model with
    those weights (rounded to bf16 the same way)."""
    from evolm.model.full import save_model

    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), LoraSpec())
    engine = LocalEngine(tiny_model_dir, layout, device="cuda")
    prompts = ["Solve: 3 + 5 =", "What is the capital of France?"]
    sampling = Sampling(max_new_tokens=16)
    factors = [torch.randn(s) * 0.01 for s in layout.shapes()]
    adapters = LoraPopulation(layout, tuple(t.unsqueeze(0).repeat(3, 1, 1) for t in factors))
    engine.generate(prompts, adapters, sampling, seed=0)  # buffers and graphs exist now
    gen = torch.Generator().manual_seed(0)
    named = {
        f"{t.path}.weight": torch.randn(t.out_features, t.in_features, generator=gen) * 0.05
        for t in layout.targets
    }
    engine.update_base_weights(named)
    after = engine.generate(prompts, adapters, sampling, seed=0)
    fresh = LocalEngine(
        str(save_model(tmp_path / "m", tiny_model_dir, named)), layout, device="cuda"
    )
    assert after == fresh.generate(prompts, adapters, sampling, seed=0)
