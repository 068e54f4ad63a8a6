"""The embedded engine: batched decoding, per-row EOS, chunking, sampling reproducibility."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from evolm.engine.base import TextRequest
from evolm.engine.local import LocalEngine
from evolm.errors import ConfigError
from evolm.es import ES
from evolm.lora import LoraLayout, LoraPopulation, LoraSpec
from evolm.sampling import Sampling

PROMPTS = ["Solve: 3 + 5 =", "Is the sky blue?", "Name three colours of the rainbow, please."]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: str) -> LocalEngine:
    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), LoraSpec(rank=2))
    return LocalEngine(tiny_model_dir, layout, device="cpu")


def population(engine: LocalEngine, members: int, sigma: float = 0.5) -> LoraPopulation:
    strategy = ES(population_size=members, sigma=sigma)
    state = strategy.init([torch.zeros(s) for s in engine.layout.shapes()], seed=3)
    return LoraPopulation(engine.layout, tuple(strategy.sample(state, strategy.ask(state))))


def test_base_generation_matches_transformers_generate(engine: LocalEngine) -> None:
    """Our decoding loop == HF greedy generate, row by row, with left padding in the batch."""
    sampling = Sampling(max_new_tokens=12)
    ours = engine.generate(PROMPTS, None, sampling, seed=0)[0]
    for prompt, text in zip(PROMPTS, ours, strict=True):
        enc = engine.tokenizer(prompt, return_tensors="pt")
        out = engine.model.generate(
            **enc,
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=engine.texts.eos_ids,
            pad_token_id=engine.texts.pad_id,
        )
        expected = engine.tokenizer.decode(
            out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True
        )
        assert text == expected


def test_members_differ_and_zero_adapters_equal_base(engine: LocalEngine) -> None:
    sampling = Sampling(max_new_tokens=10)
    pop = population(engine, members=4)
    out = engine.generate(PROMPTS, pop, sampling, seed=0)
    assert len(out) == 4 and all(len(m) == len(PROMPTS) for m in out)
    assert len({tuple(m) for m in out}) > 1, "different adapters should change outputs"
    zeros = LoraPopulation(engine.layout, tuple(torch.zeros_like(t) for t in pop.tensors))
    base = engine.generate(PROMPTS, None, sampling, seed=0)[0]
    assert engine.generate(PROMPTS, zeros, sampling, seed=0) == [base] * 4


def test_chunked_population_equals_one_batch(engine: LocalEngine) -> None:
    sampling = Sampling(max_new_tokens=10)
    pop = population(engine, members=5)
    whole = engine.generate(PROMPTS, pop, sampling, seed=0)
    engine.max_batch_rows = 2 * len(PROMPTS)
    try:
        chunked = engine.generate(PROMPTS, pop, sampling, seed=0)
    finally:
        engine.max_batch_rows = None
    assert chunked == whole


def test_each_member_alone_equals_its_rows_in_the_batch(engine: LocalEngine) -> None:
    sampling = Sampling(max_new_tokens=10)
    pop = population(engine, members=3)
    batched = engine.generate(PROMPTS, pop, sampling, seed=0)
    for m in range(3):
        alone = LoraPopulation.single(engine.layout, pop.member(m))
        assert engine.generate(PROMPTS, alone, sampling, seed=0) == [batched[m]]


def test_sampling_is_reproducible_per_seed(engine: LocalEngine) -> None:
    sampling = Sampling(max_new_tokens=16, temperature=1.5, top_p=0.9)
    a = engine.generate(PROMPTS, None, sampling, seed=7)
    assert engine.generate(PROMPTS, None, sampling, seed=7) == a
    assert engine.generate(PROMPTS, None, sampling, seed=8) != a


def test_rows_stop_at_eos(engine: LocalEngine) -> None:
    """Force EOS as the argmax after the first token through a huge EOS logit bias."""
    lm_head = engine.model.get_output_embeddings()
    eos = engine.texts.eos_ids[0]
    saved = None if lm_head.bias is None else lm_head.bias.clone()
    bias = torch.zeros(lm_head.out_features)
    bias[eos] = 1e4
    lm_head.bias = torch.nn.Parameter(bias)
    try:
        out = engine.generate(PROMPTS, None, Sampling(max_new_tokens=8), seed=0)[0]
    finally:
        lm_head.bias = None if saved is None else torch.nn.Parameter(saved)
    assert out == [""] * len(PROMPTS)


def test_bad_device_and_dtype_are_config_errors(tiny_model_dir: str) -> None:
    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), LoraSpec())
    with pytest.raises(ConfigError, match=r"^dtype: "):
        LocalEngine(tiny_model_dir, layout, device="cpu", dtype="float8")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"^device: "):
            LocalEngine(tiny_model_dir, layout, device="cuda")


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "hf-path"])
def test_generate_rows_equals_the_population_rows(
    engine: LocalEngine, tiny_model_dir: str, fast: bool
) -> None:
    """Any shard of (member, prompt) rows, in any order, gets exactly the completions those
    rows get in the whole population's generation (greedy, CPU): the fast path in one call,
    the HF path one call per set of members answering the same prompts."""
    if not fast:
        engine = LocalEngine(tiny_model_dir, engine.layout, device="cpu", fast=False)
    pop = population(engine, 3)
    prompts = [*PROMPTS, "Why?"]
    sampling = Sampling(max_new_tokens=10)
    whole = engine.generate(prompts, pop, sampling, seed=0)
    rows = [(m, p) for m in range(3) for p in range(4)]
    for shard in (rows[0::2], rows[1::2], rows[5:], [(2, 3), (0, 0), (1, 2)]):
        assert engine.generate_rows(TextRequest(prompts, pop, shard, sampling, seed=0)) == [
            whole[m][p] for m, p in shard
        ]
