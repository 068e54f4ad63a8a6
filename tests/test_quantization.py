"""``server.quantization=fp8``: fp8 projection GEMMs (W8A8), on CPU.

On CPUs ``torch._scaled_mm`` runs the same W8A8 arithmetic as on GPUs (slowly); the Triton row
quantizer is checked interpreted (``test_triton_interpreted.py``) and compiled on a GPU
(``tests/cuda_fp8_check.py``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig

from benchmarks.harness import from_model
from benchmarks.shapes import build_model
from evolm.engine.fast.fp8 import FP8_MAX, Fp8Weight, fp8_shape_problem, quantize_rows
from evolm.engine.fast.lora import GroupLora, project
from evolm.engine.fast.workspace import graph_key
from evolm.engine.local import LocalEngine
from evolm.errors import ConfigError
from evolm.lora import LoraLayout, LoraSpec
from tests.helpers import read_results, run_cli
from tests.test_fastpath import left_padded, population

CPU = torch.device("cpu")
E4M3_STEP = 2.0**-3  # e4m3 keeps 3 mantissa bits: rounding moves a normal value <= 1/16 of it


def test_weight_quantization_is_per_output_channel_and_bounded() -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(48, 64, generator=gen)
    w[3] *= 1000.0  # a channel 1000x larger keeps its own scale
    w[7] = 0.0  # an all-zero channel stays zero (no NaN from a zero scale)
    fw = Fp8Weight.quantize(w)
    assert fw.weight.dtype == torch.float8_e4m3fn and fw.scale.shape == (1, 48)
    assert torch.equal(fw.scale[0], w.abs().amax(1).clamp_min(1e-12) / FP8_MAX)
    back = fw.weight.float() * fw.scale.T
    bound = w.abs() * E4M3_STEP / 2 + fw.scale.T * 2.0**-9  # normals; subnormals' step
    assert ((back - w).abs() <= bound).all()
    assert torch.equal(back[7], torch.zeros(64)) and torch.isfinite(back).all()
    # small channels are not flattened by the large one: per-channel error stays ~3%
    err = (back - w).norm(dim=1) / w.norm(dim=1).clamp_min(1e-12)
    assert err[[0, 1, 2, 4]].max() < 0.06
    x = torch.randn(5, 64, generator=gen)
    xq, sx = quantize_rows(x)
    assert sx.shape == (5, 1)
    exact = (xq.float() * sx) @ back.T  # what the fp8 GEMM computes, in fp32
    assert torch.allclose(fw.linear(x), exact, rtol=1e-5, atol=1e-5)
    assert (fw.linear(x) - x @ w.T).norm() / (x @ w.T).norm() < 0.06


def test_lora_first_factors_in_spare_rows_stay_unquantized() -> None:
    """The GPU layout (``A`` in the weight buffer's spare rows) with fp8: the base product is
    the fp8 GEMM, ``u = x A^T`` the model's-dtype GEMM it was without fp8."""
    gen = torch.Generator().manual_seed(1)
    out, spare, members, cols = 24, 16, 2, 6  # 2 members x (2 modules x rank 3)
    weight = torch.randn(out + spare, 32, generator=gen)
    bias = torch.randn(out + spare, generator=gen)
    bias[out:] = 0.0
    lora = GroupLora(
        A=weight[out : out + members * cols].view(members, cols, 32),
        Bt=torch.zeros(members, 3, out),
        offsets=(0, 3),
        splits=(12, 12),
        spare=spare,
    )
    x = torch.randn(8, 32, generator=gen)
    fw = Fp8Weight.quantize(weight[:out])
    rows_member = torch.tensor([1, 0, 0, 1, 1, 0, 1, 0])
    for g in (lora, replace(lora, member=rows_member)):
        base, u = project(x, weight, bias, out, g)
        base8, u8 = project(x, weight, bias, out, g, fw)
        assert u is not None and u8 is not None and u8.member_stride == u.member_stride
        assert torch.allclose(u8.u, u.u, rtol=1e-6, atol=1e-6)  # exact up to fp32 order
        assert torch.allclose(base8, fw.linear(x, bias[:out]))
        assert 1e-4 < (base8 - base).norm() / base.norm() < 0.06  # quantized, close


@pytest.fixture(scope="module")
def qwen_pair() -> tuple[LocalEngine, LocalEngine]:
    def engine(quantization: str | None) -> LocalEngine:
        model = build_model("tiny", CPU, torch.float32, seed=3)
        layout = LoraLayout.from_hf_config(model.config, LoraSpec(rank=3, alpha=6.0))
        return from_model(model, layout, fast=True, quantization=quantization)

    return engine(None), engine("fp8")


def forced(engine: LocalEngine, members: int, prompts: int = 3) -> torch.Tensor:
    pop = population(engine.layout, members)
    vocab = engine.model.config.vocab_size
    ids, mask = left_padded(prompts, 9, vocab)
    ids, mask = ids.repeat(members, 1), mask.repeat(members, 1)
    tokens = torch.randint(0, vocab, (ids.shape[0], 5), generator=torch.Generator().manual_seed(1))
    assert engine.fast is not None
    with torch.inference_mode():
        return engine.fast.forced_logits(ids, mask, pop, tokens)


def test_fp8_engine_is_close_and_keeps_the_members_differences(
    qwen_pair: tuple[LocalEngine, LocalEngine],
) -> None:
    """Prefill and decode with fp8 GEMMs: logits within a few % of full precision (not equal:
    the fp8 path is really taken), and the members' logit differences, what ES ranks, survive
    (the LoRA products are not quantized)."""
    full, fp8 = qwen_pair
    assert full.fast is not None and fp8.fast is not None
    assert fp8.fast.scheduler.model.quantized and not full.fast.scheduler.model.quantized
    projs = fp8.fast.scheduler.model.projections()
    fp8_bytes = sum(p.fp8.nbytes for p in projs if p.fp8 is not None)
    assert (
        fp8.fast.scheduler.model.weight_bytes()
        == full.fast.scheduler.model.weight_bytes() + fp8_bytes
    )
    assert fp8_bytes >= sum(p.out * p.weight.shape[1] for p in projs)  # one byte per weight
    members, prompts = 3, 3
    ref, got = forced(full, members, prompts), forced(fp8, members, prompts)
    rel = ((got - ref).norm() / ref.norm()).item()
    assert 1e-4 < rel < 0.05, rel
    d_ref = ref.view(members, prompts, *ref.shape[1:])[1:] - ref[:prompts]
    d_got = got.view(members, prompts, *got.shape[1:])[1:] - got[:prompts]
    corr = torch.corrcoef(torch.stack([d_got.flatten(), d_ref.flatten()]))[0, 1].item()
    assert corr > 0.95, corr


def test_quantizing_invalidates_workspaces_and_checks_gpu_sizes(
    qwen_pair: tuple[LocalEngine, LocalEngine],
) -> None:
    """Turning fp8 on or off bumps the weights' version, so workspaces (CUDA graphs baked with
    the other GEMMs) are rebuilt; sizes ``torch._scaled_mm`` cannot take are named."""
    _, fp8 = qwen_pair
    assert fp8.fast is not None
    model = fp8.fast.scheduler.model
    version, key = model.weights_version, graph_key(model)
    model.quantize(False)
    assert not model.quantized and model.weights_version == version + 1
    assert graph_key(model) != key
    model.quantize()
    assert model.quantized
    assert fp8_shape_problem(model) is None  # the tiny model's sizes are multiples of 16
    odd = SimpleNamespace(hidden=896, inter=4860, q_out=896, kv_out=128)
    problem = fp8_shape_problem(odd)
    assert problem is not None and "intermediate_size" in problem and "4860" in problem


def test_bad_quantization_settings(tiny_model_dir: str) -> None:
    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), LoraSpec(rank=2))
    loads = LocalEngine.loads
    with pytest.raises(ConfigError) as err:
        LocalEngine(tiny_model_dir, layout, device="cpu", quantization="int4")
    assert err.value.key == "quantization" and "fp8" in str(err.value)
    assert LocalEngine.loads == loads  # refused before any model loads
    with pytest.raises(ConfigError, match="fast path") as err:
        LocalEngine(tiny_model_dir, layout, device="cpu", quantization="fp8", fast=False)
    assert err.value.key == "quantization" and "unset server.quantization" in str(err.value)
    assert LocalEngine.loads == loads


@pytest.mark.slow
def test_demo_learns_with_fp8_gemms(tmp_path: Path) -> None:
    """`python -m evolm server.quantization=fp8` (the conciseness demo): still learns."""
    run_dir = tmp_path / "run"
    proc = run_cli([f"hydra.run.dir={run_dir}", "server.quantization=fp8"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "quantization=fp8: fp8 GEMMs" in proc.stdout + proc.stderr
    assert "NOT LEARNING" not in proc.stdout + proc.stderr
    evals = [r["eval/reward_mean"] for r in read_results(run_dir) if "eval/reward_mean" in r]
    assert evals[-1] >= evals[0] + 10.0, evals  # the default demo's margin (test_app.py)
