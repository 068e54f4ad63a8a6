"""Exact speculative decoding in the tail (``server.speculate``,
:mod:`evolm.engine.fast.speculate`): greedy tokens equal plain decoding's, with fewer steps
where rows repeat themselves."""

from __future__ import annotations

import pytest
import torch

from benchmarks.harness import from_model, generate_ids, with_options
from benchmarks.shapes import build_model
from evolm.engine.fast.speculate import BITS, History
from evolm.engine.options import LocalOptions, Tuning
from evolm.errors import ConfigError
from evolm.lora import LoraLayout, LoraSpec
from evolm.sampling import Sampling
from tests.test_fastpath import left_padded, population


def test_drafts_follow_the_latest_earlier_occurrence() -> None:
    h = History([])
    h.extend([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3])
    assert h.draft(3) == [7, 1, 2]  # after the latest earlier "1 2 3", not the 3-gram at the end
    h.extend([5])  # "5" never seen before: nothing to follow, the last token repeated
    assert h.draft(2) == [5, 5]
    h.extend([2, 3])  # "2 3" last seen before 5; its continuation runs out: padded
    assert h.draft(4) == [5, 2, 3, 3]
    short = History([])
    short.extend([4])
    assert short.draft(2) == [4, 4]


def test_a_history_indexed_at_once_drafts_as_one_indexed_token_by_token() -> None:
    """A row entering the tail is indexed with numpy at once (its prompt and completion so
    far); the drafts after any later tokens are those of a history fed one token at a time."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(40):
        tokens = torch.randint(0, 5 + trial % 3 * 1000, (60 + trial,), generator=gen).tolist()
        tokens[7] = (1 << BITS) - 1  # the largest id a key holds
        at_once, by_token = History([]), History([])
        at_once.extend(tokens[:50])
        for t in tokens[:50]:
            by_token.extend([t])
        for i in range(50, len(tokens)):
            assert at_once.draft(4) == by_token.draft(4), (trial, i)
            at_once.extend([tokens[i]])
            by_token.extend([tokens[i]])
        assert at_once.after == by_token.after
    with pytest.raises(ValueError, match="token ids"):
        History([]).extend([1 << BITS])


@pytest.fixture(scope="module")
def qwen() -> torch.nn.Module:
    return build_model("tiny", torch.device("cpu"), torch.float32, seed=3)


@pytest.mark.parametrize(("k", "slots"), [(1, None), (4, None), (4, 7)])
def test_speculative_tokens_equal_plain_decoding(
    qwen: torch.nn.Module, k: int, slots: int | None
) -> None:
    """Rows of 3 members, left-padded prompts, each row its own budget, EOS ids that end some
    rows early: the same tokens with and without verify steps, in fewer steps. With 7 slots a
    verify step of 7 rows x 5 tokens takes 7 forwards of one row's 5 (never more verify rows
    than slots). Every verify row drafts k tokens, a row a token short of its budget too."""
    layout = LoraLayout.from_hf_config(qwen.config, LoraSpec(rank=2))
    plain = from_model(qwen, layout, fast=True, max_batch_rows=slots)
    spec = with_options(plain, Tuning(speculate_rows=1000), speculate=k)
    ids, mask = left_padded(4, 7, qwen.config.vocab_size, seed=4)
    pop = population(layout, 3)
    rows, masks = ids.repeat(3, 1), mask.repeat(3, 1)
    budgets, sampling = [40, 25, 60, 33] * 3, Sampling(max_new_tokens=60)
    free = generate_ids(plain, rows, masks, pop, sampling, budgets=budgets, eos_ids=[])
    eos = [int(free[0, 9]), int(free[5, 3])]  # tokens some rows write early, others not
    want = generate_ids(plain, rows, masks, pop, sampling, budgets=budgets, eos_ids=eos)
    steps = plain.last_timings["steps"]
    got = generate_ids(spec, rows, masks, pop, sampling, budgets=budgets, eos_ids=eos)
    assert torch.equal(got, want)
    timings = spec.last_timings
    assert timings["steps"] < steps
    if slots is None:  # every row in a slot from the start: every step a verify step
        assert timings["spec_steps"] == timings["steps"]
    else:  # the rows past the 7 slots wait: plain steps until the queue is empty
        assert 0 < timings["spec_steps"] < timings["steps"]
    assert timings["spec_kept"] > timings["spec_steps"]  # steps that kept drafted tokens
    # every verify row drafts k tokens, up to its last one: rows near their budgets (40, 25,
    # 33 of 60) do not cut the others' drafts
    assert timings["spec_drafted"] == k * timings["spec_rows"]
    pads = (want == plain.texts.pad_id).sum(1)  # after a row's EOS or budget
    early = [int(p) > 60 - b for p, b in zip(pads, budgets, strict=True)]
    assert 0 < sum(early) < len(early)  # some rows ended on an EOS, some ran to their budget


def test_sampled_rows_and_the_queue_decode_plainly(qwen: torch.nn.Module) -> None:
    """Temperature > 0 never speculates; greedy rows wait for the tail (the queue empty)."""
    layout = LoraLayout.from_hf_config(qwen.config, LoraSpec(rank=2))
    spec = from_model(qwen, layout, fast=True, speculate=4)
    ids, mask = left_padded(4, 7, qwen.config.vocab_size, seed=4)
    hot = Sampling(max_new_tokens=20, temperature=1.0)
    generate_ids(spec, ids, mask, None, hot, torch.Generator().manual_seed(0), eos_ids=[])
    assert "spec_steps" not in spec.last_timings


def test_speculate_is_checked_before_anything_loads() -> None:
    with pytest.raises(ConfigError, match=r"speculate: must be in 0\.\.16"):
        LocalOptions(speculate=-1)
    with pytest.raises(ConfigError, match="speculate: speculative decoding runs on the fast"):
        LocalOptions(speculate=4, fast=False)
