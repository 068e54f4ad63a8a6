"""Exact speculative decoding in the tail (``server.speculate``,
:mod:`evolm.engine.fast.speculate`): greedy tokens equal plain decoding's, with fewer steps
where rows repeat themselves."""

from __future__ import annotations

import pytest
import torch

from benchmarks.harness import from_model, generate_ids, with_options
from benchmarks.shapes import build_model
from evolm.engine.fast import speculate as speculate_module
from evolm.engine.fast.speculate import ngram_drafts
from evolm.engine.local import LocalEngine
from evolm.engine.options import LocalOptions
from evolm.errors import ConfigError
from evolm.lora import LoraLayout, LoraPopulation, LoraSpec
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


def widen(
    engine: LocalEngine,
    ids: torch.Tensor,
    mask: torch.Tensor,
    adapters: LoraPopulation | None,
    budget: int,
    rows: int,
) -> None:
    """Plan ``engine``'s workspace for ``rows`` rows as wide as ``ids`` and a widest ``budget``
    (one generation: one row runs to it, the others stop after their first token). A later
    generation of fewer rows, as wide, reuses its slots: a batch of all its rows fits one
    verify forward once ``rows`` >= its rows x (k + 1), so every step is a verify step."""
    reps = -(-rows // ids.shape[0])
    budgets = [budget] + [1] * (reps * ids.shape[0] - 1)
    sampling = Sampling(max_new_tokens=budget)
    wide, masks = ids.repeat(reps, 1), mask.repeat(reps, 1)
    generate_ids(engine, wide, masks, adapters, sampling, budgets=budgets, eos_ids=[])
    assert engine.fast is not None and engine.fast.scheduler.workspace is not None
    assert engine.fast.scheduler.workspace.slots >= rows


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


def test_verify_rows_count_the_running_rows_only(qwen: torch.nn.Module) -> None:
    """``time/engine_spec_rows`` counts the rows each verify step ran, not the rows that
    finished since the last host sync (8 steps apart; rows of budgets 3 to 40 finish between
    syncs): the count of a sync after every step, and ``spec_kept`` at least one token a row."""
    layout = LoraLayout.from_hf_config(qwen.config, LoraSpec(rank=2))
    plain = from_model(qwen, layout, fast=True)
    ids, mask = left_padded(4, 7, qwen.config.vocab_size, seed=4)
    pop = population(layout, 3)
    rows, masks = ids.repeat(3, 1), mask.repeat(3, 1)
    budgets, sampling = [40, 3, 11, 6, 29, 17, 5, 2, 23, 9, 14, 35], Sampling(max_new_tokens=40)
    counts, outs = [], []
    for every in (1, 8):
        spec = with_options(plain, speculate=2, speculate_rows=1000)
        widen(spec, rows, masks, pop, 40, len(budgets) * 3)
        assert spec.fast is not None
        spec.fast.scheduler.check_every = every
        outs.append(generate_ids(spec, rows, masks, pop, sampling, budgets=budgets, eos_ids=[]))
        timings = spec.last_timings
        counts.append(timings["spec_rows"])
        assert timings["spec_rows"] <= timings["spec_kept"] <= 3 * timings["spec_rows"]
    assert torch.equal(outs[0], outs[1])
    assert counts[0] == counts[1] > 0, counts


@pytest.mark.parametrize(("k", "slots"), [(1, None), (4, None), (1, 8)])
def test_speculative_tokens_equal_plain_decoding(
    qwen: torch.nn.Module, k: int, slots: int | None
) -> None:
    """Rows of 3 members, left-padded prompts, each row its own budget, EOS ids that end some
    rows early: the same tokens with and without verify steps, in fewer steps. With slots for
    every row's k + 1 tokens, every step is a verify step; with 8 slots the rows past them wait
    (plain steps until the queue is empty), then a batch verifies once its bucket's rows x
    (k + 1) verify rows fit the 8 slots (never more verify rows than slots). Every verify row
    drafts k tokens, a row a token short of its budget too."""
    layout = LoraLayout.from_hf_config(qwen.config, LoraSpec(rank=2))
    plain = from_model(qwen, layout, fast=True, max_batch_rows=slots)
    spec = with_options(plain, speculate=k, speculate_rows=1000)
    ids, mask = left_padded(4, 7, qwen.config.vocab_size, seed=4)
    pop = population(layout, 3)
    rows, masks = ids.repeat(3, 1), mask.repeat(3, 1)
    budgets, sampling = [40, 25, 60, 33] * 3, Sampling(max_new_tokens=60)
    free = generate_ids(plain, rows, masks, pop, sampling, budgets=budgets, eos_ids=[])
    eos = [int(free[0, 9]), int(free[5, 3])]  # tokens some rows write early, others not
    want = generate_ids(plain, rows, masks, pop, sampling, budgets=budgets, eos_ids=eos)
    steps = plain.last_timings["steps"]
    if slots is None:
        widen(spec, rows, masks, pop, 60, len(budgets) * (k + 1))
    got = generate_ids(spec, rows, masks, pop, sampling, budgets=budgets, eos_ids=eos)
    assert torch.equal(got, want)
    timings = spec.last_timings
    assert timings["steps"] < steps
    if slots is None:  # every row in a slot from the start: every step a verify step
        assert timings["spec_steps"] == timings["steps"]
    else:  # the rows past the 8 slots wait: plain steps until the queue is empty
        assert 0 < timings["spec_steps"] < timings["steps"]
    assert timings["spec_kept"] > timings["spec_steps"]  # steps that kept drafted tokens
    # every verify row drafts k tokens, up to its last one: rows near their budgets (40, 25,
    # 33 of 60) do not cut the others' drafts
    assert timings["spec_drafted"] == k * timings["spec_rows"]
    pads = (want == plain.texts.pad_id).sum(1)  # after a row's EOS or budget
    early = [int(p) > 60 - b for p, b in zip(pads, budgets, strict=True)]
    assert 0 < sum(early) < len(early)  # some rows ended on an EOS, some ran to their budget


@pytest.mark.parametrize(("k", "slots"), [(4, None), (6, 3), (4, 1)])
def test_rows_at_a_full_cache_feed_drafts_past_it_at_its_last_position(
    qwen: torch.nn.Module, k: int, slots: int | None
) -> None:
    """Prompt width + widest budget = 64, a multiple of the cache's 16-position rounding, and
    the workspace plans 64 positions, none for drafts (session 36: 4 positions of room, rounded
    to 16, cost W-real ~25 of its 2,046 slots): the drafts of a row near its budget that would
    land past the cache are fed at its last position, and the tokens are the same. One slot
    never speculates. With 3 slots (k = 2: a row's 3 tokens fill a forward of them) the widest
    row ends alone, in verify steps."""
    layout = LoraLayout.from_hf_config(qwen.config, LoraSpec(rank=2))
    ids, mask = left_padded(4, 7, qwen.config.vocab_size, seed=4)
    widest = 64 - ids.shape[1]
    plain = from_model(qwen, layout, fast=True, max_batch_rows=slots)
    spec = with_options(plain, speculate=k, speculate_rows=1000)
    sampling = Sampling(max_new_tokens=widest)
    if slots is None:  # every row at once, in a workspace wide enough: all verify steps
        pop, rows, masks = population(layout, 3), ids.repeat(3, 1), mask.repeat(3, 1)
        budgets = [widest, widest - 1, widest - 7, 3] * 3
        widen(spec, rows, masks, pop, widest, len(budgets) * (k + 1))
    else:  # the short rows first beside the widest, which then decodes alone
        pop, rows, masks, budgets = population(layout, 2), ids, mask, [widest, 3, 3, 3]
    want = generate_ids(plain, rows, masks, pop, sampling, budgets=budgets, eos_ids=[])
    got = generate_ids(spec, rows, masks, pop, sampling, budgets=budgets, eos_ids=[])
    assert torch.equal(got, want)
    assert spec.fast is not None and spec.fast.scheduler.workspace is not None
    assert spec.fast.scheduler.workspace.positions == rows.shape[1] + widest == 64
    timings = spec.last_timings
    if slots == 1:
        assert "spec_steps" not in timings
    else:  # a row's k + 1 tokens fit one forward: k <= slots - 1
        drafts = k if slots is None else min(k, slots - 1)
        assert timings["spec_drafted"] == drafts * timings["spec_rows"] > 0
        if slots is None:
            assert timings["spec_steps"] == timings["steps"]


@pytest.mark.parametrize(("tail", "slots"), [(1000, None), (2, None), (1000, 3)])
def test_verify_steps_draft_from_each_rows_prompt_and_tokens(
    qwen: torch.nn.Module, monkeypatch: pytest.MonkeyPatch, tail: int, slots: int | None
) -> None:
    """Each verify step drafts from each running row's slot history: its prompt (written by the
    prefill; left padding and the columns past the current token masked), then its tokens,
    the current one last, whether verify steps wrote them (tail 1000: every step) or plain
    decode steps did before the tail (tail 2), in slots that earlier rows held (3 slots), in a
    workspace that a generation of longer prompts left behind. The run is the row's prompt ids
    then its tokens in ``out`` (the layout drafts came from before the history), and the drafts
    are the rule's over it. (The tokens would be equal with wrong drafts: only fewer kept.)"""
    layout = LoraLayout.from_hf_config(qwen.config, LoraSpec(rank=2))
    k, budgets = 3, [40, 25, 60, 33, 45, 30, 50, 20, 55, 35, 28, 38]  # rows end one by one
    plain = from_model(qwen, layout, fast=True, max_batch_rows=slots)
    spec = with_options(plain, speculate=k, speculate_rows=tail)
    assert spec.fast is not None
    scheduler = spec.fast.scheduler
    seen: list[tuple[torch.Tensor, ...]] = []
    real = speculate_module.ngram_drafts

    def recording(
        seq: torch.Tensor, valid: torch.Tensor, last: torch.Tensor, n: int
    ) -> torch.Tensor:
        out = real(seq, valid, last, n)
        ws = scheduler.workspace
        assert ws is not None
        sel = ws.sel[: seq.shape[0]]  # the step's batch: its state before the step
        seen.append((seq, valid, last, out, ws.row[sel], ws.gen[sel], ws.done[sel]))
        assert n == min(k, ws.slots - 1)
        return out

    monkeypatch.setattr(speculate_module, "ngram_drafts", recording)
    pop, sampling = population(layout, 3), Sampling(max_new_tokens=60)
    for width in (11, 7):  # the longer prompts first: their tokens stay in the history's columns
        ids, mask = left_padded(4, width, qwen.config.vocab_size, seed=width)
        rows, masks = ids.repeat(3, 1), mask.repeat(3, 1)
        if tail == 1000 and slots is None and width == 11:
            widen(spec, rows, masks, pop, 60, len(budgets) * (k + 1))
        seen.clear()
        want = generate_ids(plain, rows, masks, pop, sampling, budgets=budgets, eos_ids=[])
        got = generate_ids(spec, rows, masks, pop, sampling, budgets=budgets, eos_ids=[])
        assert torch.equal(got, want)
        timings = spec.last_timings
        if tail == 2:  # the tail began after plain decode steps
            assert 0 < timings["spec_steps"] < timings["steps"]
        checked = 0
        for seq, valid, last, drafts, row, gen, done in seen:
            for i in range(seq.shape[0]):
                if done[i]:  # finished since the last sync (or the scratch slot): never kept
                    continue
                r, g = int(row[i]), int(gen[i])
                run = rows[r][masks[r].bool()].tolist() + got[r, :g].tolist()
                assert seq[i][valid[i]].tolist() == run, (width, r, g)
                assert int(valid[i].nonzero().max()) == int(last[i])  # the current token last
                assert drafts[i].tolist() == reference_drafts(run, drafts.shape[1]), (width, r)
                checked += 1
        assert checked > 0


def test_token_history_only_for_speculating_greedy_generations(qwen: torch.nn.Module) -> None:
    """The workspace's token history is allocated (and planned: 8 bytes a position and slot)
    for greedy generations with ``speculate`` only: none without it or when sampling; a
    workspace without one is planned anew for a generation that needs one, one with it serves
    both."""
    layout = LoraLayout.from_hf_config(qwen.config, LoraSpec(rank=2))
    plain = from_model(qwen, layout, fast=True)
    spec = with_options(plain, speculate=4)
    ids, mask = left_padded(4, 7, qwen.config.vocab_size, seed=4)
    greedy, hot = Sampling(max_new_tokens=20), Sampling(max_new_tokens=20, temperature=1.0)
    for engine, sampling, history in [
        (plain, greedy, False),
        (spec, hot, False),
        (spec, greedy, True),
    ]:
        assert engine.fast is not None
        engine.fast.scheduler.reset()
        generate_ids(
            engine, ids, mask, None, sampling, torch.Generator().manual_seed(0), eos_ids=[]
        )
        ws, plan = engine.fast.scheduler.workspace, engine.fast.scheduler.plan
        assert ws is not None and plan is not None
        assert (ws.hist is not None) == history
        if ws.hist is not None:
            assert ws.hist.shape == (ws.slots + 1, ws.positions) and ws.hist.dtype == torch.long
    assert plain.fast is not None and spec.fast is not None
    without, speculating = plain.fast.scheduler.plan, spec.fast.scheduler.plan
    assert without is not None and speculating is not None
    assert speculating.positions == without.positions == 32  # 7 + 20 (+ k = 4), rounded to 16
    assert speculating.per_slot == without.per_slot + 8 * speculating.positions
    scheduler = spec.fast.scheduler
    scheduler.reset()
    bare = scheduler.prepare(4, 40, True, None)
    assert bare.hist is None
    kept = scheduler.prepare(4, 40, True, None, history=True)
    assert kept is not bare and kept.hist is not None
    assert scheduler.prepare(4, 40, True, None) is kept


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
