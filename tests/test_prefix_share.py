"""Shared prompt prefixes in prefill (``server.share_prefix``, :mod:`evolm.engine.fast.prefix`):
a member's rows that begin with the same tokens copy a donor's K/V of them, and the tokens
generated are plain prefill's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.harness import from_model, generate_ids, with_options
from benchmarks.shapes import build_model
from evolm.engine.fast import prefix as prefix_module
from evolm.engine.fast.prefix import Prompts, common_prefix, plan_shares
from evolm.engine.options import LocalOptions
from evolm.errors import ConfigError
from evolm.lora import LoraLayout, LoraSpec
from evolm.sampling import Sampling
from tests.helpers import COUNTDOWN_MODEL, read_results, run_cli
from tests.test_fastpath import population
from tests.test_speculate import widen

RUN = [  # two generations of the countdown task on the tiny model, an eval after each
    "task=countdown",
    *COUNTDOWN_MODEL,
    "generations=2",
    "eval_every=1",
    "es.population_size=4",
    "task.max_new_tokens=16",
    "task.samples_per_generation=3",
    "task.eval_samples=6",
    "logger=none",
]


@pytest.fixture(scope="module")
def qwen() -> torch.nn.Module:
    return build_model("tiny", torch.device("cpu"), torch.float32, seed=3)


def prompts_with_prefixes(
    heads: list[int], tails: list[int], vocab: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded rows: row ``i`` is shared head ``heads[i]`` (two distinct heads of 40 and 27
    tokens, the second beginning with the first's first 20) then ``tails[i]`` tokens of its own."""
    gen = torch.Generator().manual_seed(seed)
    first = torch.randint(3, vocab, (40,), generator=gen)
    second = torch.cat([first[:20], torch.randint(3, vocab, (7,), generator=gen)])
    rows = [
        torch.cat([(first, second)[h], torch.randint(3, vocab, (t,), generator=gen)])
        for h, t in zip(heads, tails, strict=True)
    ]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :], mask[i, width - len(r) :] = r, 1
    return ids, mask


def test_donors_and_shares_follow_the_longest_common_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Per member, the first row is a donor; a later row copies the donor it shares most with,
    up to its own length - 1, if that is at least MIN_SHARED tokens, and becomes a donor too
    when that is under DONOR_SHARE of its tokens (while there is room), prefilled one depth
    after its own donor; other members never share; past MAX_DONORS a row copies what it can."""
    ids, mask = prompts_with_prefixes([0, 0, 1, 1, 0, 0], [5, 9, 4, 5, 0, 3], 50)
    prompts = Prompts(ids, mask)
    width = ids.shape[1]
    assert prompts.lengths == [45, 49, 31, 32, 40, 43] and width == 49
    assert common_prefix(prompts.tokens[0], prompts.tokens[2]) == 20
    shares = plan_shares(prompts, [0, 1, 2, 3, 4, 5], [0, 0, 0, 0, 0, 1])
    # row 1 copies row 0's 40-token head (40 of 49); row 2 copies the 20 tokens it shares with
    # row 0 (of 31: a donor too); row 3 copies row 2's 27-token head, more than its 20 with
    # row 0; row 4 is row 0's head alone (40 tokens): it copies 39, the last one computed for
    # its logits; row 5: member 1
    assert shares.donor == [-1, 0, 0, 2, 0, -1]
    starts = [width - n for n in prompts.lengths]
    assert shares.end == [0, starts[1] + 40, starts[2] + 20, starts[3] + 27, starts[4] + 39, 0]
    assert shares.levels() == [[0, 5], [1, 2, 4], [3]]
    assert plan_shares(prompts, [0, 1], None).donor == [-1, 0]  # one model for every row
    monkeypatch.setattr(prefix_module, "MAX_DONORS", 1)  # no room for a second donor: row 2
    assert plan_shares(prompts, [0, 2, 3], [0] * 6).donor == [-1, 0, 0]  # copies its 20 tokens
    monkeypatch.setattr(prefix_module, "MIN_SHARED", 21)  # ... unless under MIN_SHARED: whole
    assert plan_shares(prompts, [0, 2, 3], [0] * 6).donor == [-1, -1, -1]


@pytest.mark.parametrize(("slots", "speculate"), [(None, 0), (5, 0), (None, 3)])
def test_shared_prefixes_give_plain_prefills_tokens(
    qwen: torch.nn.Module, slots: int | None, speculate: int
) -> None:
    """Three members, rows of two shared heads and tails of 0-30 tokens (left-padded to one
    width, so the copies shift), greedy: the same tokens as plain prefill, and most prompt
    positions copied. With 5 slots the rows come in several prefill batches, each with its own
    donors, and a chunk of 2 rows makes each batch several forwards. With speculative decoding
    every step a verify step, drafting from the slots' token history (the prompts included)."""
    layout = LoraLayout.from_hf_config(qwen.config, LoraSpec(rank=2))
    plain = from_model(qwen, layout, fast=True, max_batch_rows=slots)
    shared = with_options(plain, share_prefix=True, speculate=speculate, speculate_rows=1000)
    heads, tails = [0, 0, 1, 1, 0, 1, 0], [5, 9, 4, 30, 0, 12, 17]
    ids, mask = prompts_with_prefixes(heads, tails, qwen.config.vocab_size, seed=1)
    pop = population(layout, 3)
    rows, masks = ids.repeat(3, 1), mask.repeat(3, 1)
    sampling = Sampling(max_new_tokens=12)
    want = generate_ids(plain, rows, masks, pop, sampling, eos_ids=[])
    assert plain.last_timings["prefix_copied"] == 0
    if slots is not None:
        assert shared.fast is not None
        shared.fast.scheduler.prefill_tokens = 2 * ids.shape[1]  # 2 rows a forward
    if speculate:  # slots for every row's k + 1 verify rows: every step a verify step
        widen(shared, rows, masks, pop, 12, rows.shape[0] * (speculate + 1))
    got = generate_ids(shared, rows, masks, pop, sampling, eos_ids=[])
    assert torch.equal(got, want)
    assert shared.last_timings.get("spec_steps", 0) == (
        shared.last_timings["steps"] if speculate else 0
    )
    # one batch: 6 donors of 21 rows (two heads, three members); batches of 5 rows: more
    assert shared.last_timings["prefix_copied"] > (0.3 if slots is None else 0.1)


def test_shared_prefixes_keep_the_prompts_logits(qwen: torch.nn.Module) -> None:
    """The first token's logits of every row (sampled rows see them whole) are plain prefill's
    to fp32 rounding (4e-7 here, 8e-5 in other draws: 2e-4 allowed; a wrong copy or mask moves
    them by O(1)), for rows that share and rows that donate, with the base model too."""
    layout = LoraLayout.from_hf_config(qwen.config, LoraSpec(rank=2))
    plain = from_model(qwen, layout, fast=True)
    shared = with_options(plain, share_prefix=True)
    ids, mask = prompts_with_prefixes([0, 1, 0, 1, 0], [3, 8, 11, 0, 21], qwen.config.vocab_size)
    gen = torch.Generator().manual_seed(2)
    for pop in (None, population(layout, 2)):
        members = 1 if pop is None else len(pop)
        rows, masks = ids.repeat(members, 1), mask.repeat(members, 1)
        forced = torch.randint(3, qwen.config.vocab_size, (rows.shape[0], 4), generator=gen)
        got, want = (e.fast.forced_logits(rows, masks, pop, forced) for e in (shared, plain))  # type: ignore[union-attr]
        torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)  # fp32 rounding, any BLAS
        assert shared.last_timings["prefix_copied"] > 0.2


def test_a_countdown_run_with_shared_prefixes_is_the_same_run(
    tmp_path: Path, countdown_model_dir: str
) -> None:
    """``python -m evolm task=countdown server.share_prefix=true`` on the tiny model: the same
    members' fitness, the same mean and the same evaluations as without it, every generation,
    with part of every generation's prompt positions copied (its members' rows share the
    paper's instructions)."""
    runs = {}
    for share in ("false", "true"):
        out = tmp_path / share
        args = [*RUN, f"server.share_prefix={share}", f"hydra.run.dir={out}"]
        proc = run_cli(args)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs[share] = read_results(out)
    for plain, shared in zip(runs["false"], runs["true"], strict=True):
        learned = {k for k in plain if k.split("/")[0] in ("train", "eval", "es")}
        assert learned and {k: plain[k] for k in learned} == {k: shared[k] for k in learned}
    trained = [r for r in runs["true"] if "train/fitness_mean" in r]
    assert len(trained) == 2 and all(r["time/engine_prefix_copied"] > 0.1 for r in trained)
    assert all(r.get("time/engine_prefix_copied", 0) == 0 for r in runs["false"])


def test_an_fp8_cache_refuses_shared_prefixes() -> None:
    """With an fp8 KV cache a row would attend over its copied prefix as the cache rounds it,
    where plain prefill attends over the unrounded K/V: one ConfigError naming the key."""
    with pytest.raises(ConfigError) as e:
        LocalOptions(share_prefix=True, kv_cache_dtype="fp8")
    assert e.value.key == "share_prefix" and "kv_cache_dtype" in str(e.value)
    assert LocalOptions(share_prefix=True).share_prefix


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("ops", ["triton", "eager"])
def test_cuda_shared_prefixes_keep_the_prompts_logits_fp32(ops: str) -> None:
    """On a GPU in fp32, with the Triton kernels or without: every row's logits after its
    prompt and after each forced token equal plain prefill's to 1e-3 (the CPU test's check on
    the GPU's prefill path, its copies and its graphs)."""
    model = build_model("tiny", torch.device("cuda"), torch.float32, seed=3)
    layout = LoraLayout.from_hf_config(model.config, LoraSpec(rank=2))
    plain = from_model(model, layout, fast=True)
    assert plain.fast is not None
    plain.fast.scheduler.model.set_ops(ops)
    shared = with_options(plain, share_prefix=True)
    ids, mask = prompts_with_prefixes([0, 1, 0, 1, 0], [3, 8, 11, 0, 21], model.config.vocab_size)
    pop = population(layout, 2)
    rows, masks = ids.repeat(2, 1).cuda(), mask.repeat(2, 1).cuda()
    gen = torch.Generator().manual_seed(2)
    forced = torch.randint(3, model.config.vocab_size, (rows.shape[0], 4), generator=gen).cuda()
    got, want = (e.fast.forced_logits(rows, masks, pop, forced) for e in (shared, plain))  # type: ignore[union-attr]
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    assert shared.last_timings["prefix_copied"] > 0.2
