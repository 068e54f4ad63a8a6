"""Exact speculative decoding in the tail (``server.speculate``,
:mod:`evolm.engine.fast.speculate`): greedy tokens equal plain decoding's, with fewer steps
where rows repeat themselves."""

from __future__ import annotations

import pytest
import torch

from benchmarks.harness import from_model, generate_ids, with_options
from benchmarks.shapes import build_model
from evolm.engine.fast.speculate import ngram_drafts
from evolm.engine.options import LocalOptions, Tuning
from evolm.errors import ConfigError
from evolm.lora import LoraLayout, LoraSpec
from evolm.sampling import Sampling
from tests.test_fastpath import left_padded, population


def reference_drafts(tokens: list[int], k: int) -> list[int]:
    """The drafting rule, token by token: what followed the latest occurrence of the longest
    suffix (3, 2, 1 tokens) that ends before the last token, padded with the last token;
    none: the last token repeated."""
    last = len(tokens) - 1
    for n in range(min(3, len(tokens)), 0, -1):
        for end in range(last - 1, n - 2, -1):
            if tokens[end - n + 1 : end + 1] == tokens[-n:]:
                cont = tokens[end + 1 : end + 1 + k]
                return cont + [tokens[-1]] * (k - len(cont))
    return [tokens[-1]] * k


def drafts_of(rows: list[list[int]], k: int, width: int, pad: int = 0) -> list[list[int]]:
    """:func:`ngram_drafts` of ``rows`` left-padded to ``width`` with ``pad`` (not theirs)."""
    seq = torch.full((len(rows), width), pad)
    valid = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        seq[i, width - len(r) :], valid[i, width - len(r) :] = torch.tensor(r), True
    return ngram_drafts(seq, valid, torch.full((len(rows),), width - 1), k).tolist()


def test_drafts_follow_the_latest_earlier_occurrence() -> None:
    [latest] = drafts_of([[1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3]], 3, 11)
    assert latest == [7, 1, 2]  # after the latest earlier "1 2 3", not the 3-gram at the end
    [unseen] = drafts_of([[1, 2, 3, 9, 5]], 2, 8)
    assert unseen == [5, 5]  # "5" never seen before: the last token repeated
    # "2 3" last seen before 5; its continuation runs into the last token: padded with it
    [runs_out] = drafts_of([[1, 2, 3, 5, 2, 3]], 4, 6)
    assert runs_out == [5, 2, 3, 3]
    assert drafts_of([[4]], 2, 3) == [[4, 4]]  # one token, the padding never matched


def test_drafts_on_the_device_follow_the_rule_token_by_token() -> None:
    """Rows of any length, left-padded (the padding token also occurs in the rows), few
    distinct tokens (many matches) or many (few): the drafts of the rule above."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(30):
        vocab, k = (3, 5, 50)[trial % 3], 1 + trial % 5
        lengths = torch.randint(1, 40, (6,), generator=gen).tolist()
        rows = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
        want = [reference_drafts(r, k) for r in rows]
        assert drafts_of(rows, k, 45, pad=1) == want, trial


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


@pytest.mark.parametrize(("k", "slots"), [(4, None), (6, 3), (4, 1)])
def test_rows_at_a_full_cache_draft_into_the_planned_spare_positions(
    qwen: torch.nn.Module, k: int, slots: int | None
) -> None:
    """Prompt width + widest budget = 64, a multiple of the cache's 16-position rounding: only
    the k positions planned past the widest budget hold the drafts of a row at its budget
    (without them: an index past the cache). The same tokens; one slot never speculates."""
    layout = LoraLayout.from_hf_config(qwen.config, LoraSpec(rank=2))
    ids, mask = left_padded(4, 7, qwen.config.vocab_size, seed=4)
    widest = 64 - ids.shape[1]
    plain = from_model(qwen, layout, fast=True, max_batch_rows=slots)
    spec = with_options(plain, Tuning(speculate_rows=1000), speculate=k)
    pop = population(layout, 3)
    rows, masks = ids.repeat(3, 1), mask.repeat(3, 1)
    budgets, sampling = [widest, widest - 1, widest - 7, 3] * 3, Sampling(max_new_tokens=widest)
    want = generate_ids(plain, rows, masks, pop, sampling, budgets=budgets, eos_ids=[])
    got = generate_ids(spec, rows, masks, pop, sampling, budgets=budgets, eos_ids=[])
    assert torch.equal(got, want)
    timings = spec.last_timings
    if slots == 1:
        assert "spec_steps" not in timings
    else:  # a row's k + 1 tokens fit one forward: k <= slots - 1
        drafts = k if slots is None else min(k, slots - 1)
        assert timings["spec_drafted"] == drafts * timings["spec_rows"] > 0


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
