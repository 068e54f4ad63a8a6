"""How far the mean is from the base model: the eval's KL(mean-adapted || base) along its
completions, and the update's and the mean's weight change relative to the base weights. Each
is checked against the same number computed the plain way (merged weights, materialised dW)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM

from evolm import metrics as M
from evolm.callbacks import RunContext
from evolm.callbacks.results import ResultsWriter
from evolm.engine.base import Completion, Engine, TextRequest
from evolm.engine.local import LocalEngine
from evolm.es import ES
from evolm.evaluate import kl_to_base
from evolm.loop import ESLoop
from evolm.lora import LoraLayout, LoraPopulation, LoraSpec, es_scales, uniform_scales
from evolm.lora.norms import delta_norm, weight_norm
from evolm.sampling import Sampling
from evolm.task.base import Example
from evolm.task.conciseness import Conciseness
from tests.helpers import read_results

PROMPTS = ["Solve: 7 + 6 =", "Is ice colder than boiling water?", "Name a colour."]


@pytest.fixture(scope="module")
def layout(tiny_model_dir: str) -> LoraLayout:
    return LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), LoraSpec(rank=2))


def random_adapter(layout: LoraLayout, seed: int, scale: float = 0.05) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen) * scale for s in layout.shapes()]


def merged_logits(
    model_dir: str, layout: LoraLayout, adapter: Sequence[torch.Tensor] | None
) -> torch.nn.Module:
    """A fresh transformers model with ``W + scaling * B A`` written into its weights."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if adapter is not None:
        for target, a, b in layout.pairs(adapter):
            weight = model.get_submodule(target.path).weight
            weight.data += layout.scaling * (b @ a)
    return model


def test_kl_along_completions_equals_merged_weights(
    tiny_model_dir: str, layout: LoraLayout
) -> None:
    """The engine's per-token KL (teacher-forced, adapter as multi-LoRA) equals F.kl_div of a
    merged-weights model against the base on the same tokens; one value per generated token,
    plus the EOS step of a completion that ended on one."""
    engine = LocalEngine(tiny_model_dir, layout, device="cpu", dtype="float32")
    adapter = random_adapter(layout, seed=1)
    mean = LoraPopulation.single(layout, adapter)
    [texts] = engine.generate(PROMPTS, mean, Sampling(max_new_tokens=6), seed=0)
    assert {t.truncated for t in texts} == {True, False}
    got = engine.kl_to_base(PROMPTS, texts, mean)
    base = merged_logits(tiny_model_dir, layout, None)
    tuned = merged_logits(tiny_model_dir, layout, adapter)
    for prompt, text, values in zip(PROMPTS, texts, got, strict=True):
        assert len(values) == text.tokens + (not text.truncated)
        prompt_ids = engine.tokenizer(prompt)["input_ids"]
        ids = torch.tensor([prompt_ids + list(text.token_ids)])
        first = len(prompt_ids) - 1
        with torch.no_grad():
            log_a = F.log_softmax(tuned(ids).logits[0, first : first + len(values)], dim=-1)
            log_b = F.log_softmax(base(ids).logits[0, first : first + len(values)], dim=-1)
        want = F.kl_div(log_b, log_a, log_target=True, reduction="none").sum(-1)
        assert torch.tensor(values) == pytest.approx(want, abs=1e-5)
        assert min(values) >= 0 and max(values) > 0


def test_a_zero_adapter_is_the_base_model(tiny_model_dir: str, layout: LoraLayout) -> None:
    engine = LocalEngine(tiny_model_dir, layout, device="cpu", fast=False)
    zero = LoraPopulation.single(layout, [torch.zeros(s) for s in layout.shapes()])
    [texts] = engine.generate(PROMPTS, zero, Sampling(max_new_tokens=4), seed=0)
    assert all(v == 0.0 for row in engine.kl_to_base(PROMPTS, texts, zero) for v in row)


class SilentEngine(Engine):
    """An engine that cannot score KL (as the server clients): the hook's default."""

    layout = LoraLayout((), 1, 1.0, 1)

    def format_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        return ""

    def generate_rows(self, request: TextRequest) -> list[str]:
        return ["x"] * len(request.rows)

    def close(self) -> None: ...


def test_engines_that_cannot_score_log_no_kl() -> None:
    pop = LoraPopulation(SilentEngine.layout, (torch.zeros(1, 1, 1),))
    assert kl_to_base(SilentEngine(), [Example("q")], [Completion("x")], pop) == {}


def test_weight_change_norms_equal_the_materialised_ones(
    tiny_model_dir: str, layout: LoraLayout
) -> None:
    before, after = random_adapter(layout, 2), random_adapter(layout, 3)
    dense = [
        layout.scaling * (b1.double() @ a1.double() - b0.double() @ a0.double())
        for (_, a0, b0), (_, a1, b1) in zip(layout.pairs(before), layout.pairs(after), strict=True)
    ]
    want = torch.stack([d.norm() for d in dense]).norm().item()
    assert delta_norm(layout, after, before) == pytest.approx(want, rel=1e-9)
    alone = [layout.scaling * (b.double() @ a.double()) for _, a, b in layout.pairs(after)]
    assert delta_norm(layout, after, None) == pytest.approx(
        torch.stack([d.norm() for d in alone]).norm().item(), rel=1e-9
    )
    model = merged_logits(tiny_model_dir, layout, None)
    weights = [model.get_submodule(t.path).weight.double() for t in layout.targets]
    assert weight_norm(tiny_model_dir, layout) == pytest.approx(
        torch.stack([w.norm() for w in weights]).norm().item(), rel=1e-9
    )


def test_a_run_logs_kl_and_relative_updates(
    tmp_path: Path, tiny_model_dir: str, layout: LoraLayout
) -> None:
    """The start's eval (B = 0: the base model) has KL 0; the first update is the mean's whole
    change; the KL grows as the mean moves away."""
    spec = LoraSpec(rank=2)
    engine = LocalEngine(tiny_model_dir, layout, device="cpu")
    es = ES(population_size=4, sigma=0.02, alpha=0.6, update="natural")
    scales = uniform_scales(layout)
    state = es.init(layout.init_mean(spec, scales, 0), 0, es_scales(spec, scales))
    loop = ESLoop(
        es,
        Conciseness(max_new_tokens=8),
        engine,
        layout,
        generations=3,
        eval_every=1,
        seed=0,
        callbacks=[ResultsWriter()],
        base_norm=weight_norm(tiny_model_dir, layout),
    )
    loop.run(state, RunContext(tmp_path, 3, layout, tiny_model_dir))
    start, first, *_, last = read_results(tmp_path)
    assert start[M.EVAL_KL_MEAN] == 0.0 and start[M.EVAL_KL_STD] == 0.0
    assert first[M.UPDATE_REL] == pytest.approx(first[M.MEAN_REL], rel=1e-9)
    assert first[M.UPDATE_REL] > 0
    assert last[M.MEAN_REL] > first[M.MEAN_REL]
    assert last[M.EVAL_KL_MEAN] > 0 and last[M.EVAL_KL_STD] > 0
