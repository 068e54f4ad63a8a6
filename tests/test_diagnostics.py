"""The diagnostics of a population's completions (evolm.diagnostics): on the real tiny model's
completions, and the numbers they give on hand-written ones."""

from __future__ import annotations

import math
import pickle

import pytest
import torch
from transformers import AutoConfig

from evolm import metrics as M
from evolm.diagnostics import completion_stats, pair_agreement, summarize
from evolm.engine.base import Completion
from evolm.engine.local import LocalEngine
from evolm.es import ES
from evolm.lora import LoraLayout, LoraSpec
from evolm.sampling import Sampling

PROMPTS = ["Solve: 7 + 6 =", "Is ice colder than boiling water?", "Name a colour.", "Hello"]


@pytest.fixture(scope="module")
def layout(tiny_model_dir: str) -> LoraLayout:
    return LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), LoraSpec())


@pytest.mark.parametrize("fast", [None, False])
def test_the_local_engine_says_how_each_completion_ended(
    tiny_model_dir: str, layout: LoraLayout, fast: bool | None
) -> None:
    """Fast and HF paths: a completion cut at the budget has exactly max_new_tokens tokens, one
    that ended on an EOS fewer; the token ids decode to the text."""
    engine = LocalEngine(tiny_model_dir, layout, device="cpu", fast=fast)
    budget = 6
    [texts] = engine.generate(PROMPTS, None, Sampling(max_new_tokens=budget), seed=0)
    assert all(isinstance(t, Completion) for t in texts)
    ended = {t.truncated for t in texts}
    assert ended == {True, False}, "the tiny model ends some answers early, runs on in others"
    for t in texts:
        assert t.token_ids is not None and t.tokens == len(t.token_ids)
        assert (t.tokens == budget) if t.truncated else (t.tokens < budget)
        assert engine.tokenizer.decode(list(t.token_ids), skip_special_tokens=True) == t
    stats = summarize(completion_stats(texts), {}, members=1, prompts=len(PROMPTS))
    assert stats[M.TRUNCATED_SHARE] == sum(t.truncated for t in texts) / len(texts)
    assert stats[M.COMPLETION_TOKENS] == sum(t.tokens for t in texts) / len(texts)


def test_a_completion_pickles_with_what_the_engine_said() -> None:
    """A distributed evaluation gathers completions by pickling them."""
    c = pickle.loads(pickle.dumps(Completion("ab", truncated=True, token_ids=[5, 6])))
    assert (c, c.tokens, c.truncated, c.token_ids) == ("ab", 2, True, (5, 6))
    assert Completion("", token_ids=[]).tokens == 0


def test_summarize_counts_shares_distinct_answers_and_pass_at_n() -> None:
    """2 members x 3 prompts, member-major."""
    texts = [
        Completion("a", tokens=1, truncated=False),
        Completion("  ", tokens=1, truncated=False),
        Completion("long", tokens=4, truncated=True),
        Completion("a", tokens=1, truncated=False),
        Completion("b", tokens=1, truncated=False),
        Completion("", tokens=0, truncated=False),
    ]
    accuracy = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    out = summarize(completion_stats(texts), {"accuracy": accuracy}, members=2, prompts=3)
    assert out == {
        M.PROMPTS: 3.0,
        M.EMPTY_SHARE: 2 / 6,
        M.COMPLETION_TOKENS: 8 / 6,
        M.TRUNCATED_SHARE: 1 / 6,
        M.DISTINCT_PER_PROMPT: (1 + 2 + 2) / 3,  # prompt 0: both wrote "a"
        M.PASS_AT_POPULATION: 1 / 3,
    }


def test_what_the_engine_does_not_say_is_left_out() -> None:
    """Plain strings (vLLM's token counts, an engine that says nothing): no length, no
    truncation; one member: nothing across members; no accuracy score: no pass@N."""
    out = summarize(completion_stats(["x", "", "yy"]), {"reward": [0.0] * 3}, 1, 3)
    assert out == {M.PROMPTS: 3.0, M.EMPTY_SHARE: 1 / 3}
    mixed = [Completion("x", truncated=True), "y"]
    assert M.TRUNCATED_SHARE not in summarize(completion_stats(mixed), {}, 2, 1)


def test_pair_agreement_counts_mirrored_pairs_that_tie() -> None:
    es = ES(population_size=6, antithetic=True)
    pop = es.ask(es.init([torch.zeros(2)], seed=0))
    fitness = torch.tensor([1.0, 1.0, 2.0, 3.0, math.nan, math.nan])
    assert pair_agreement(fitness, pop.seeds, pop.signs) == pytest.approx(2 / 3)
    plain = ES(population_size=4).ask(ES(population_size=4).init([torch.zeros(2)], seed=0))
    assert pair_agreement(torch.zeros(4), plain.seeds, plain.signs) is None
