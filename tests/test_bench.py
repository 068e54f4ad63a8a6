"""Smoke test of the benchmark on the smallest shape (CPU, a few seconds); not a measurement."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.__main__ import main
from benchmarks.roofline import Dims, floor
from benchmarks.shapes import shape_config
from tests.helpers import REPO


def test_bench_tiny_writes_json_and_markdown(tmp_path) -> None:
    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    args = ["--shape", "tiny", "--members", "3", "--prompts", "2", "--prompt-len", "8"]
    args += ["--new-tokens", "4", "--reps", "1", "--baseline-members", "1", "--device", "cpu"]
    assert main([*args, "--json", str(out_json), "--markdown", str(out_md)]) == 0
    (record,) = json.loads(out_json.read_text())
    results = record["results"]
    assert set(results) == {"evolm", "base", "paper", "paper_fast", "hf_lora"}
    assert results["evolm"]["tokens"] == 3 * 2 * 4  # forced: every row makes every token
    assert results["paper"]["members_timed"] == 1
    assert {"lora_overhead", "paper_over_evolm", "bookkeeping_share"} <= set(record["ratios"])
    assert record["check"]["argmax_agree"] == 1.0 and record["check"]["max_abs_diff"] < 1e-4
    assert "(a) evolm local engine" in out_md.read_text()


@pytest.mark.slow  # make test-all
def test_bench_imports_no_hydra() -> None:
    code = (
        "import sys, benchmarks.__main__\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('hydra', 'omegaconf', 'mlflow')"
        " or m in ('evolm.config', 'evolm.app')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_roofline_matches_the_reference_floor() -> None:
    """~3.3 s for the 7B shape, 30 x 32 rows, 64 + 128 tokens at 790 TFLOP/s (environment.md)."""
    dims = Dims.from_config(shape_config("qwen2.5-7b"))
    result = floor(dims, 960, 64, 128, 4, 790e12, 4.3e12)
    assert 3.0 < result["floor_s"] < 3.6
    assert result["compute_s"] > result["memory_s"]


def test_bench_fp8_methods_time_the_quantized_engine(tmp_path) -> None:
    """``--methods evolm_fp8,base_fp8``: the same engine with fp8 projection GEMMs, then back
    (the bf16 run after it is unquantized)."""
    out_json = tmp_path / "bench.json"
    args = ["--shape", "tiny", "--members", "2", "--prompts", "2", "--prompt-len", "8"]
    args += ["--new-tokens", "4", "--reps", "1", "--device", "cpu"]
    args += ["--methods", "evolm_fp8,base_fp8,evolm", "--json", str(out_json)]
    assert main(args) == 0
    (record,) = json.loads(out_json.read_text())
    assert set(record["results"]) == {"evolm", "evolm_fp8", "base_fp8"}
    assert record["results"]["evolm_fp8"]["tokens"] == 2 * 2 * 4
    assert {"fp8_speedup", "lora_overhead_fp8"} <= set(record["ratios"])
    assert record["check"]["max_abs_diff"] < 1e-4  # the engine was left unquantized


@pytest.mark.slow  # make test-all
def test_real_bench_cpu_smoke_and_waves_refused(tmp_path) -> None:
    """W-real's driver on the tiny shape (``python -m benchmarks.real``, a subprocess): the local
    methods through the public engine API generate every forced token, speculation the same
    tokens as plain decoding; ``waves`` (removed) is recorded as an error, not run."""
    out_json = tmp_path / "real.json"
    args = ["--shape", "tiny", "--members", "2", "--prompts", "3", "--prompt-len", "8"]
    args += ["--new-tokens", "40", "--device", "cpu", "--regimes", "variable,fixed"]
    methods = "continuous,continuous_fp8,continuous_spec_r540,waves"  # spec: rows of 16-40
    args += ["--methods", methods, "--json", str(out_json)]
    proc = subprocess.run(  # from the checkout's root: benchmarks/ is not installed
        [sys.executable, "-m", "benchmarks.real", *args], capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out_json.read_text())
    for regime in ("variable", "fixed"):
        res = record["results"][regime]
        assert res["continuous"]["tokens"] == res["tokens"] == res["continuous_fp8"]["tokens"]
        assert res["continuous"]["slots"] == 2 * 3  # every row has a slot (no device budget)
        assert "continuous batching replaced it" in res["waves"]["error"]
        spec, plain = res["continuous_spec_r540"], res["continuous"]  # exact on the CPU
        assert spec["tokens_sha256"] == plain["tokens_sha256"], regime
        assert spec["rows_equal"] == plain["rows_equal"] == 2 * 3, regime  # every row
    assert record["results"]["fixed"]["tokens"] == 2 * 3 * 40
    spec = record["results"]["variable"]["continuous_spec_r540"]["timings"]
    assert spec["spec_steps"] > 0, spec  # its tail verified (a row alone fits k + 1 slots)
    assert "| waves | error |" in proc.stdout


@pytest.mark.slow  # make test-all
def test_real_bench_times_each_ranks_shard(tmp_path) -> None:
    """``--ranks 2 --shard interleaved,balanced``: after the whole population, each of the 2
    shards of the rows (interleaved; balanced with each row's budget as its cost),
    with its seconds, tokens and decode steps; the speed-up is the whole population's seconds
    over the slowest shard's. Balanced shards differ in tokens by one row's budget at most;
    interleaved ones need not."""
    from benchmarks.real import lengths, shards

    out_json, out_md = tmp_path / "real.json", tmp_path / "real.md"
    args = ["--real", "--shape", "tiny", "--members", "4", "--prompts", "4", "--prompt-len", "8"]
    args += ["--new-tokens", "32", "--device", "cpu", "--regimes", "variable"]
    args += ["--methods", "continuous", "--ranks", "2", "--shard", "interleaved,balanced"]
    assert main([*args, "--json", str(out_json), "--markdown", str(out_md)]) == 0
    res = json.loads(out_json.read_text())["results"]["variable"]
    assert set(res["continuous"]["shards"]) == {"interleaved", "balanced"}
    sh = res["continuous"]["shards"]["balanced"]
    assert (sh["mode"], sh["ranks"]) == ("balanced", 2)
    per = sh["per_shard"]
    assert sum(s["tokens"] for s in per) == res["tokens"] and sum(s["rows"] for s in per) == 16
    assert all(s["seconds"] > 0 and s["steps"] > 0 for s in per)
    assert sh["slowest_s"] == max(s["seconds"] for s in per)
    assert sh["speedup"] == res["continuous"]["seconds"] / sh["slowest_s"]
    budgets = lengths("variable", 16, 32)
    assert abs(per[0]["tokens"] - per[1]["tokens"]) <= max(budgets)
    spread = {
        mode: [sum(budgets[i] for i in share) for share in shards(16, budgets, 2, mode)]
        for mode in ("interleaved", "balanced")
    }
    assert [s["tokens"] for s in per] == spread["balanced"]
    interleaved = res["continuous"]["shards"]["interleaved"]["per_shard"]
    assert [s["tokens"] for s in interleaved] == spread["interleaved"]
    assert max(spread["balanced"]) < max(spread["interleaved"])  # 147 / 144 vs 133 / 158
    table = out_md.read_text()
    assert "| 2 balanced |" in table and "| 2 interleaved |" in table
    with pytest.raises(SystemExit, match="--shard: unknown"):
        main([*args[:-1], "rows", "--json", str(out_json)])


ENGINE_API = {  # the Engine protocol, the local engine, its options, its paths' requests
    "evolm.engine",
    "evolm.engine.base",
    "evolm.engine.local",
    "evolm.engine.options",
    "evolm.engine.backend",
}
KERNEL_BENCHES = {  # they time kernels, or pick them, directly (or run the HF modules bare)
    "benchmarks.kernels",
    "benchmarks.slot_tune",
    "benchmarks.tune",
    "benchmarks.methods",  # the paper / HF-LoRA baselines: evolm.engine.hf.multilora
    "benchmarks.detokenize_overlap",  # the host's detokenizer alone (evolm.engine.texts)
}


def test_benchmarks_use_the_public_engine_api() -> None:
    """Outside the kernel benchmarks, benchmarks import the engine only through its public API
    (LocalEngine, its options, the Engine protocol), and no benchmark sets an engine's field."""
    import ast

    import grimp

    graph = grimp.build_graph("benchmarks", "evolm", cache_dir=None)
    for module in sorted(graph.find_children("benchmarks") | {"benchmarks"}):
        imported = {
            m
            for m in graph.find_modules_directly_imported_by(module)
            if m.startswith("evolm.engine")
        }
        if module not in KERNEL_BENCHES:
            assert imported <= ENGINE_API, (module, sorted(imported - ENGINE_API))
    for path in sorted((REPO / "benchmarks").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Attribute):
                        t = t.value  # engine.x.y = ...: still the engine's
                    bad = isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                    assert not (bad and "engine" in t.value.id), (path.name, ast.unparse(t))
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "setattr":
                assert "engine" not in ast.unparse(node.args[0]), (path.name, ast.unparse(node))
