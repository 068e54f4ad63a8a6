"""LoRA spec/layout/PEFT files, and the local engine's logits against peft.PeftModel."""

from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel
from transformers import AutoConfig, AutoModelForCausalLM

from evolm import dist
from evolm.app.modes import make_mode
from evolm.engine.hf.multilora import load_population
from evolm.engine.local import LocalEngine
from evolm.errors import ConfigError
from evolm.es import ES
from evolm.lora import (
    LoraLayout,
    LoraPopulation,
    LoraSpec,
    LoraTarget,
    es_scales,
    load_adapter,
    save_adapter,
)
from tests.helpers import read_results, run_cli


def layout_for(model_dir: str, **spec: object) -> tuple[LoraSpec, LoraLayout]:
    lora = LoraSpec(**spec)  # type: ignore[arg-type]
    return lora, LoraLayout.from_hf_config(AutoConfig.from_pretrained(model_dir), lora)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"rank": 0}, "rank"),
        ({"target_modules": ["q_proj", "qkv"]}, "target_modules"),
        ({"init": "kaiming"}, "init"),
        ({"alpha": 0}, "alpha"),
        ({"noise_scale": "huge"}, "noise_scale"),
        ({"sigma_units": "percent"}, "sigma_units"),
        ({"init_scale": 0.0}, "init_scale"),  # weight units need A != 0
    ],
)
def test_bad_spec_names_the_key(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{key}: .*Fix: "):
        LoraSpec(**kwargs)


def _member_weight_changes(
    spec: LoraSpec, sigma: float, layer_scales: list[float]
) -> tuple[LoraLayout, list[torch.Tensor]]:
    """``dW = alpha/rank * (B_m A_m - B A)`` of 64 members around the initial mean, per target."""
    layout = LoraLayout(
        targets=(LoraTarget(0, "q_proj", 96, 80), LoraTarget(0, "down_proj", 160, 96)),
        rank=spec.rank,
        alpha=spec.alpha,
        num_layers=1,
    )
    mean = layout.init_mean(spec, layer_scales, seed=0)
    es = ES(population_size=64, sigma=sigma)
    state = es.init(mean, seed=1, scales=es_scales(spec, layer_scales))
    members = es.sample(state, es.ask(state))
    changes = []
    for (_, a, b), (_, a0, b0) in zip(layout.pairs(members), layout.pairs(mean), strict=True):
        changes.append(spec.scaling * (b @ a - b0 @ a0))
    return layout, changes


@pytest.mark.parametrize("rank", [1, 4, 8])
def test_weight_units_make_sigma_the_std_of_each_weight_change(rank: int) -> None:
    """lora.sigma_units=weight: every entry of a member's dW has std es.sigma (zero_b init),
    whatever the rank, alpha and init_scale; with weight_mean, times the layer's scale."""
    sigma = 0.001
    for alpha, init_scale in ((2.0 * rank, 0.1), (1.0, 0.3)):
        spec = LoraSpec(rank=rank, alpha=alpha, init_scale=init_scale)
        _, changes = _member_weight_changes(spec, sigma, [1.0] * 4)
        for dw in changes:
            assert dw.std().item() == pytest.approx(sigma, rel=0.15)  # one draw of A
            assert dw.mean().abs().item() < 0.05 * sigma
    spec = LoraSpec(rank=rank, init_scale=0.1, noise_scale="weight_mean")
    _, changes = _member_weight_changes(spec, sigma, [0.5, 0.5, 3.0, 3.0])
    assert [dw.std().item() / sigma for dw in changes] == pytest.approx([0.5, 3.0], rel=0.15)


def test_factor_units_are_the_literal_noise_on_the_factors() -> None:
    spec = LoraSpec(rank=4, alpha=8.0, init_scale=0.1, sigma_units="factor")
    assert es_scales(spec, [1.0, 1.0, 2.0, 2.0]) == [1.0, 1.0, 2.0, 2.0]
    weight = LoraSpec(rank=4, alpha=8.0, init_scale=0.1)
    assert weight.factor_noise_unit == pytest.approx(1 / (2.0 * 2.0 * 0.1))
    assert es_scales(weight, [1.0, 3.0]) == [weight.factor_noise_unit] * 2
    _, changes = _member_weight_changes(spec, 0.001, [1.0] * 4)
    # B's noise is sigma itself: dW = 2 * eps_B @ A has std 2 * 0.001 * sqrt(4) * 0.1
    assert changes[0].std().item() == pytest.approx(0.0004, rel=0.05)


def test_layer_out_of_range_is_a_config_error(tiny_model_dir: str) -> None:
    with pytest.raises(ConfigError, match="target_layers: layer 7 does not exist"):
        layout_for(tiny_model_dir, target_layers=[0, 7])


def test_layout_shapes_follow_the_model(tiny_model_dir: str) -> None:
    _, layout = layout_for(tiny_model_dir, rank=2, target_modules=["k_proj", "down_proj"])
    cfg = AutoConfig.from_pretrained(tiny_model_dir)
    kv = cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    assert layout.shapes()[:4] == [
        (2, cfg.hidden_size),
        (kv, 2),
        (2, cfg.intermediate_size),
        (cfg.hidden_size, 2),
    ]
    assert len(layout.targets) == 2 * cfg.num_hidden_layers


def random_population(layout: LoraLayout, members: int, seed: int = 1) -> LoraPopulation:
    strategy = ES(population_size=members, sigma=0.05)
    mean = [
        torch.randn(s, generator=torch.Generator().manual_seed(i)) * 0.05
        for i, s in enumerate(layout.shapes())
    ]
    state = strategy.init(mean, seed=seed)
    return LoraPopulation(layout, tuple(strategy.sample(state, strategy.ask(state))))


@pytest.mark.parametrize("target_layers", [None, [1]])
def test_local_engine_logits_equal_peft(tiny_model_dir: str, tmp_path, target_layers) -> None:
    """Member m's rows through MultiLoraLinear == PeftModel with member m's adapter files.

    Tolerance: fp32 on CPU, max |diff| <= 1e-5 (the two paths order the same matmuls
    differently, so bit-equality is not expected).
    """
    _, layout = layout_for(tiny_model_dir, rank=3, alpha=6.0, target_layers=target_layers)
    population = random_population(layout, members=3)
    engine = LocalEngine(tiny_model_dir, layout, device="cpu", dtype="float32")
    prompts = ["Solve: 3 + 5 =", "What is the capital of France? Answer in one word."]
    enc = engine.tokenizer(prompts, return_tensors="pt", padding=True)
    load_population(engine.layers, population, engine.device, engine.dtype)
    with torch.inference_mode():
        ours = engine.model(
            input_ids=enc["input_ids"].repeat(3, 1),
            attention_mask=enc["attention_mask"].repeat(3, 1),
        ).logits
    for m in range(3):
        path = save_adapter(tmp_path / f"m{m}", layout, population.member(m), tiny_model_dir)
        config = json.loads((path / "adapter_config.json").read_text())
        assert config["peft_type"] == "LORA" and config["use_rslora"] is False
        assert config["r"] == 3 and config["lora_alpha"] == 6.0
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        peft_model = PeftModel.from_pretrained(base, str(path)).eval()
        with torch.inference_mode():
            theirs = peft_model(**enc).logits
        mask = enc["attention_mask"].bool()
        diff = (ours[2 * m : 2 * m + 2] - theirs)[mask].abs().max().item()
        assert diff <= 1e-5, f"member {m}: max |logit diff| {diff}"
    # and the adapters really change the model: member 0 differs from the base model
    load_population(engine.layers, None, engine.device, engine.dtype)
    with torch.inference_mode():
        plain = engine.model(**enc).logits
    assert (plain - ours[:2]).abs().max() > 1e-3


def test_adapter_roundtrip_is_exact_and_atomic(tiny_model_dir: str, tmp_path) -> None:
    _, layout = layout_for(tiny_model_dir, rank=2)
    tensors = random_population(layout, members=2).member(1)
    path = save_adapter(tmp_path / "adapter", layout, tensors, tiny_model_dir)
    save_adapter(path, layout, [t * 2 for t in tensors], tiny_model_dir)  # replace in place
    back = load_adapter(path, layout)
    assert all(torch.equal(a * 2, b) for a, b in zip(tensors, back, strict=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]  # no temp dirs left


def test_init_from_starts_the_mean_at_the_adapter(tiny_model_dir: str, tmp_path) -> None:
    """``lora.init_from``: the run's first mean is the adapter's tensors, exactly (fp32)."""
    lora, layout = layout_for(tiny_model_dir, rank=2, alpha=4.0)
    tensors = random_population(layout, members=2).member(0)
    path = save_adapter(tmp_path / "adapter", layout, tensors, tiny_model_dir)
    lora = LoraSpec(rank=2, alpha=4.0, init_from=str(path))
    mode = make_mode(ES(population_size=4, sigma=0.01), layout, lora, tiny_model_dir)
    scales = [1.0] * len(layout.shapes())
    state = mode.start(None, None, seed=0, scales=scales, comm=dist.SINGLE)  # type: ignore[arg-type]
    assert all(torch.equal(a, b) for a, b in zip(state.mean, tensors, strict=True))
    assert f"from {path}" in mode.describe(3)
    drawn = make_mode(ES(population_size=4, sigma=0.01), layout, LoraSpec(rank=2, alpha=4.0), "m")
    fresh = drawn.start(None, None, seed=0, scales=scales, comm=dist.SINGLE)  # type: ignore[arg-type]
    assert not all(torch.equal(a, b) for a, b in zip(fresh.mean, tensors, strict=True))


def test_init_from_that_cannot_serve_is_a_config_error(tiny_model_dir: str, tmp_path) -> None:
    """A missing directory, another rank, another set of targets, or full mode: one error naming
    ``init_from`` and the fix, before the model loads."""
    with pytest.raises(ConfigError, match=r"^init_from: .*does not exist.*Fix: "):
        LoraSpec(init_from=str(tmp_path / "nowhere"))
    _, layout = layout_for(tiny_model_dir, rank=2, alpha=4.0)
    path = save_adapter(tmp_path / "a", layout, random_population(layout, 2).member(0), "m")
    with pytest.raises(ConfigError, match=r"^init_from: .*r=2.*Fix: set lora.rank=2 lora.alpha"):
        LoraSpec(rank=4, alpha=4.0, init_from=str(path))
    _, attention = layout_for(tiny_model_dir, rank=2, alpha=4.0, target_modules=["q_proj"])
    narrow = save_adapter(tmp_path / "q", attention, random_population(attention, 2).member(0), "m")
    with pytest.raises(ConfigError, match=r"^init_from: .*tensors missing"):
        make_mode(
            ES(population_size=4), layout, LoraSpec(rank=2, alpha=4.0, init_from=str(narrow)), "m"
        )
    with pytest.raises(ConfigError, match=r"^init_from: .*es.mean=full"):
        full = ES(population_size=4, mean="full")
        make_mode(full, layout, LoraSpec(rank=2, alpha=4.0, init_from=str(path)), tiny_model_dir)


def test_a_run_from_another_runs_adapter_starts_where_it_ended(tmp_path) -> None:
    """``python -m evolm lora.init_from=<run>/adapter``: the new run's start evaluates the first
    run's final mean, to the same reward (greedy, CPU). The first run also keeps its best
    evaluation's mean (``keep_best``): ``adapter-best/best.json`` names the first of its
    highest evals, and the adapter is the final one exactly when that eval is the last."""
    args = ["generations=3", "eval_every=1", "es.population_size=6", "task.max_new_tokens=12"]
    first = run_cli(
        [*args, "keep_best=eval/reward_mean", f"hydra.run.dir={tmp_path / 'a'}"], timeout=180
    )
    assert first.returncode == 0, first.stderr[-3000:]
    adapter = tmp_path / "a" / "adapter"
    rewards = [r["eval/reward_mean"] for r in read_results(tmp_path / "a")]
    best = json.loads((tmp_path / "a" / "adapter-best" / "best.json").read_text())
    assert best == {
        "generation": rewards.index(max(rewards)),
        "metric": "eval/reward_mean",
        "value": max(rewards),
    }
    final = (adapter / "adapter_model.safetensors").read_bytes()
    kept = (tmp_path / "a" / "adapter-best" / "adapter_model.safetensors").read_bytes()
    assert (kept == final) == (best["generation"] == 3)
    second = run_cli(
        [*args, "generations=1", f"lora.init_from={adapter}", f"hydra.run.dir={tmp_path / 'b'}"],
        timeout=180,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    evals = [
        [
            (r["generation"], r["eval/reward_mean"])
            for r in read_results(tmp_path / n)
            if "eval/reward_mean" in r
        ]
        for n in ("a", "b")
    ]
    assert evals[0][-1][0] == 3 and evals[1][0][0] == 0
    assert evals[1][0][1] == evals[0][-1][1] != evals[0][0][1]  # where a ended, not the base
