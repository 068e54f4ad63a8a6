"""Continuous batching (evolm.engine.fast.scheduler) and its memory planner, on CPU.

Greedy tokens with forced refills (fewer slots than rows), per-row budgets and EOS mid-batch
must equal the HF path's one batch and transformers' generate."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from benchmarks.harness import from_model, generate_ids, with_options
from evolm.callbacks.base import Callback, RunContext, Sample
from evolm.engine.backend import TokenRequest
from evolm.engine.fast.model import to_cache
from evolm.engine.fast.plan import (
    MARGIN,
    GiB,
    Shape,
    activation_bytes,
    host_memory,
    plan_slots,
    prefill_tokens,
)
from evolm.engine.fast.workspace import MiB, buckets
from evolm.engine.local import LocalEngine
from evolm.engine.texts import RowDecoder
from evolm.errors import ConfigError
from evolm.es import ES
from evolm.evaluate import render
from evolm.loop import ESLoop
from evolm.lora import LoraLayout, LoraPopulation, LoraSpec
from evolm.sampling import Sampling
from evolm.task.base import eval_sampling
from evolm.task.conciseness import Conciseness

PROMPTS = ["Solve: 3 + 5 =", "Is the sky blue?", "Name three colours of the rainbow, please."]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: str) -> LocalEngine:
    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), LoraSpec(rank=2))
    return LocalEngine(tiny_model_dir, layout, device="cpu")


def population(engine: LocalEngine, members: int) -> LoraPopulation:
    strategy = ES(population_size=members, sigma=0.5)
    state = strategy.init([torch.zeros(s) for s in engine.layout.shapes()], seed=3)
    return LoraPopulation(engine.layout, tuple(strategy.sample(state, strategy.ask(state))))


def rows(engine: LocalEngine, members: int) -> tuple[torch.Tensor, torch.Tensor]:
    enc = engine.tokenizer(PROMPTS, return_tensors="pt", padding=True)
    return enc["input_ids"].repeat(members, 1), enc["attention_mask"].repeat(members, 1)


def one_batch(engine: LocalEngine, *args: object, **kw: object) -> torch.Tensor:
    """The HF path's lock-step batch over the same model (the reference)."""
    hf = from_model(engine.model, engine.layout, engine.tokenizer, fast=False)
    try:
        return generate_ids(hf, *args, **kw)  # type: ignore[arg-type]
    finally:
        engine.use_layout(engine.layout)  # the fast engine's own wrappers back


def test_refills_equal_one_batch_and_transformers(engine: LocalEngine) -> None:
    """3 slots for 12 rows of 4 members: rows finish and refill; tokens == lock-step batch."""
    pop = population(engine, 4)
    ids, mask = rows(engine, 4)
    sampling = Sampling(max_new_tokens=9)
    reference = one_batch(engine, ids, mask, pop, sampling, eos_ids=[])
    capped = with_options(engine, max_batch_rows=3)
    slotted = generate_ids(capped, ids, mask, pop, sampling, eos_ids=[])
    assert capped.last_timings["slots"] == 3 and capped.last_timings["prefills"] >= 4
    assert torch.equal(slotted, reference)
    # the base model's rows equal transformers' generate
    base = generate_ids(engine, ids[:3], mask[:3], None, sampling, eos_ids=[])
    for i, prompt in enumerate(PROMPTS):
        enc = engine.tokenizer(prompt, return_tensors="pt")
        ref = engine.model.generate(
            **enc,
            max_new_tokens=9,
            do_sample=False,
            eos_token_id=engine.texts.eos_ids,
            pad_token_id=0,
        )
        want = ref[0, enc["input_ids"].shape[1] :].tolist()
        assert base[i, : len(want)].tolist() == want  # HF stops at EOS; ours ran on (eos_ids=[])


def mixed_rows(engine: LocalEngine) -> tuple:
    """9 rows of 3 members: ``(pop, ids, mask, member, full, eos, budgets)``; ``full``: their 12
    greedy tokens without an EOS, ``eos`` a token that row 1 emits mid-way, ``budgets`` mixed."""
    pop = population(engine, 3)
    ids, mask = rows(engine, 3)
    member = torch.arange(3).repeat_interleave(len(PROMPTS))
    sampling = Sampling(max_new_tokens=12)
    full = generate_ids(engine, ids, mask, pop, sampling, member=member, eos_ids=[])
    budgets = [1 + (5 * i) % 12 for i in range(ids.shape[0])]
    return pop, ids, mask, member, full, int(full[1, 4]), budgets


def test_mixed_budgets_and_eos_mid_batch(engine: LocalEngine) -> None:
    """Per-row budgets and an EOS that some rows hit early: each row is its full run cut at its
    budget / first EOS, whatever the other rows do; freed slots take the waiting rows."""
    pop, ids, mask, member, full, eos, budgets = mixed_rows(engine)
    n, sampling = ids.shape[0], Sampling(max_new_tokens=12)
    capped = with_options(engine, max_batch_rows=4)
    got = generate_ids(
        capped, ids, mask, pop, sampling, member=member, budgets=budgets, eos_ids=[eos]
    )
    assert got.shape == (n, max(budgets))
    stopped = 0
    for i in range(n):
        want = full[i, : budgets[i]].tolist()
        if eos in want:
            want = want[: want.index(eos) + 1]
            stopped += len(want) < budgets[i]
        row = got[i].tolist()
        assert row[: len(want)] == want
        assert all(t == engine.texts.pad_id for t in row[len(want) :])
    assert stopped >= 1, "the test should stop a row at EOS before its budget"


def test_the_tail_is_the_steps_that_serve_a_few_long_rows(engine: LocalEngine) -> None:
    """Issue 37: ``time/engine_tail_s`` times the decode steps with an empty queue and fewer
    than a tenth of the slots busy. 30 rows on 30 slots: with one long row its last 25 steps
    are the tail; with equal budgets no step is."""
    ids, mask = rows(engine, 10)  # 30 rows of the base model
    sampling, n = Sampling(max_new_tokens=30), ids.shape[0]
    generate_ids(engine, ids, mask, None, sampling, budgets=[5] * (n - 1) + [30], eos_ids=[])
    skewed = engine.last_timings
    assert skewed["slots"] >= n  # all rows admitted at once: the queue empties at the start
    assert skewed["tail_steps"] >= 24, skewed  # one row of 30 slots runs alone after step 5
    assert 0 < skewed["tail_s"] <= skewed["generate_s"], skewed
    generate_ids(engine, ids, mask, None, sampling, budgets=[30] * n, eos_ids=[])
    even = engine.last_timings
    assert even["tail_steps"] == 0 and even["tail_s"] == 0.0, even


def test_the_host_time_around_the_engine_is_split_by_phase(engine: LocalEngine) -> None:
    """Issue 37: a text generation reports its host phases beside the engine's own
    (``time/engine_host_tokenize_s``, ``_stage_s``, ``_detokenize_s``)."""
    engine.generate(PROMPTS, population(engine, 2), Sampling(max_new_tokens=4), seed=0)
    timings = engine.last_timings
    host = {k: v for k, v in timings.items() if k.startswith("host_")}
    assert set(host) == {"host_tokenize_s", "host_stage_s", "host_detokenize_s"}, timings
    assert all(0 <= v < timings["generate_s"] + 10 for v in host.values()), timings


@pytest.mark.parametrize("batch", [1, 5])
def test_rows_decode_while_the_engine_runs(engine: LocalEngine, batch: int) -> None:
    """Issue 37: rows are decoded as they finish, in batches, on a worker thread beside the
    engine (:class:`RowDecoder`); the texts equal decoding the whole tensor at the end, with
    slots refilled, per-row budgets, EOS mid-batch and a stop string, and only the rows that
    finish last wait for the end."""
    pop, ids, mask, member, full, eos, budgets = mixed_rows(engine)
    n = ids.shape[0]
    word = engine.tokenizer.decode(full[2, 3:6])  # a stop string that row 2 writes
    sampling = Sampling(max_new_tokens=12, stop=(word.strip() or word,))
    capped = with_options(engine, max_batch_rows=4)
    decoder = RowDecoder(capped.texts, n, sampling.stop, batch)
    request = TokenRequest(ids, mask, pop, sampling, [eos], None, member, budgets)
    tokens = capped.backend.generate_ids(request, retired=decoder.retired)
    streamed = decoder.finish(tokens)
    whole = capped.texts.completions(tokens, sampling.stop)
    assert [str(c) for c in streamed] == [str(c) for c in whole]
    assert [(c.token_ids, c.truncated, c.stopped) for c in streamed] == [
        (c.token_ids, c.truncated, c.stopped) for c in whole
    ]
    assert any(c.stopped for c in whole) and any(c.truncated for c in whole)
    assert n - batch < decoder.early <= n  # all but the last rows, fewer than a batch
    # a text generation streams too, and reports how many rows it decoded early
    capped.generate(PROMPTS, pop, sampling, seed=0)
    assert capped.last_timings["detokenized_early"] > 0


def test_shuffled_rows_of_any_member(engine: LocalEngine) -> None:
    """Rows in any order, members interleaved: each row equals its member-major counterpart."""
    pop = population(engine, 3)
    ids, mask = rows(engine, 3)
    sampling = Sampling(max_new_tokens=6)
    member = torch.arange(3).repeat_interleave(len(PROMPTS))
    ordered = generate_ids(engine, ids, mask, pop, sampling, member=member, eos_ids=[])
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(0))
    capped = with_options(engine, max_batch_rows=5)
    shuffled = generate_ids(
        capped, ids[perm], mask[perm], pop, sampling, member=member[perm], eos_ids=[]
    )
    assert torch.equal(shuffled, ordered[perm])


def test_prefill_by_member_runs_keeps_each_rows_draws(engine: LocalEngine) -> None:
    """Prefills take their rows sorted by member; eager LoRA by member runs (one GEMM per
    member's run of tokens) samples the same tokens, row by row, as the per-row path."""
    assert engine.fast is not None
    pop = population(engine, 3)
    ids, mask = rows(engine, 3)
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(1))
    member = torch.arange(3).repeat_interleave(len(PROMPTS))[perm]
    hot = Sampling(max_new_tokens=6, temperature=1.0)

    def sampled() -> torch.Tensor:
        seed = torch.Generator().manual_seed(7)
        return generate_ids(
            engine, ids[perm], mask[perm], pop, hot, seed, member=member, eos_ids=[]
        )

    by_runs = sampled()
    engine.fast.scheduler.runner.prefill_runs = False
    try:
        per_row = sampled()
    finally:
        engine.fast.scheduler.runner.prefill_runs = True
    assert torch.equal(by_runs, per_row)


def test_fp8_cache_writes_saturate() -> None:
    """Values beyond e4m3's range are clamped to +-448 as the kernels' stores do, never NaN."""
    cache = torch.zeros(4, dtype=torch.float8_e4m3fn)
    got = to_cache(torch.tensor([1000.0, -1e6, 3.3, 0.0]), cache).float()
    assert got.tolist() == [448.0, -448.0, 3.25, 0.0]
    same = torch.ones(2)
    assert to_cache(same, torch.zeros(2)) is same


def test_generate_text_equals_hf_path(engine: LocalEngine) -> None:
    """The public generate (EOS on) gives the same texts on both paths."""
    pop = population(engine, 2)
    sampling = Sampling(max_new_tokens=10)
    cont = with_options(engine, max_batch_rows=2).generate(PROMPTS, pop, sampling, seed=0)
    hf = from_model(engine.model, engine.layout, engine.tokenizer, fast=False)
    try:
        old = hf.generate(PROMPTS, pop, sampling, seed=0)
    finally:
        engine.use_layout(engine.layout)
    assert cont == old and len(cont) == 2 and len(cont[0]) == len(PROMPTS)


SHAPE = Shape(
    layers=28, kv_heads=2, head_dim=128, hidden=1536, inter=8960, q_out=1536, vocab=151936,
    itemsize=2, weight_bytes=3 * GiB, name="qwen2.5-1.5b", dtype="bfloat16",
)  # fmt: skip


def test_workspace_kept_for_smaller_generations(engine: LocalEngine) -> None:
    """An evaluation (fewer rows) after a population's generation reuses its slots, cache and
    graphs instead of planning and allocating again; more positions than it has: re-planned."""
    assert engine.fast is not None
    pop = population(engine, 4)
    ids, mask = rows(engine, 4)
    sampling = Sampling(max_new_tokens=6)
    engine.fast.scheduler.reset()
    alone = generate_ids(engine, ids[:3], mask[:3], None, sampling, eos_ids=[])
    generate_ids(engine, ids, mask, pop, sampling, eos_ids=[])
    ws = engine.fast.scheduler.workspace
    assert ws is not None and ws.slots == ids.shape[0]
    after = generate_ids(engine, ids[:3], mask[:3], None, sampling, eos_ids=[])
    assert engine.fast.scheduler.workspace is ws
    assert torch.equal(after, alone)
    generate_ids(engine, ids[:3], mask[:3], None, Sampling(max_new_tokens=60), eos_ids=[])
    assert engine.fast.scheduler.workspace is not ws and engine.fast.scheduler.workspace is not None


def test_old_workspace_freed_before_a_new_plan(
    engine: LocalEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A generation that needs more positions than the workspace has re-plans: the old cache must
    be freed BEFORE the planner measures free memory (a reference kept in the scheduler's frame
    left a 1.5B run's eval with "0 MiB after 119.5 GiB in use" on an H200)."""
    import evolm.engine.fast.scheduler as scheduler_module

    assert engine.fast is not None
    ids, mask = rows(engine, 1)
    engine.fast.scheduler.reset()
    generate_ids(engine, ids, mask, None, Sampling(max_new_tokens=4), eos_ids=[])
    old = weakref.ref(engine.fast.scheduler.workspace)
    seen: list[bool] = []
    real = scheduler_module.plan_slots

    def measuring(*args: object, **kw: object) -> object:
        seen.append(old() is None)  # what the planner would see: the old cache still held?
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(scheduler_module, "plan_slots", measuring)
    generate_ids(engine, ids, mask, None, Sampling(max_new_tokens=40), eos_ids=[])
    assert seen == [True]


CHUNK = GiB // activation_bytes(SHAPE)  # prefill tokens: about a GiB of activations


def test_planner_sizes_slots_from_free_memory() -> None:
    total = 80 * GiB
    plan = plan_slots(SHAPE, 6000, 1152, True, CHUNK, 0.9, None, (total - 4 * GiB, total))
    kv = 2 * 28 * 2 * 128 * 1152 * 2  # 28 KiB per position
    assert kv <= plan.per_slot < kv * 1.01
    assert plan.slots == (int(0.9 * total) - 4 * GiB - plan.fixed) // plan.per_slot
    assert 1500 < plan.slots < 2200
    capped = plan_slots(SHAPE, 6000, 1152, True, CHUNK, 0.9, 500, (total - 4 * GiB, total))
    assert capped.slots == 500
    few = plan_slots(SHAPE, 40, 1152, True, CHUNK, 0.9, None, (total - 4 * GiB, total))
    assert few.slots == 40
    cpu = plan_slots(SHAPE, 40, 1152, True, CHUNK, 0.9, 7, None)
    assert cpu.slots == 7
    # an fp8 cache: half the KV bytes per slot, so about twice the slots in the same budget
    fp8 = plan_slots(
        replace(SHAPE, kv_itemsize=1), 6000, 1152, True, CHUNK, 0.9, None, (total - 4 * GiB, total)
    )
    assert kv // 2 <= fp8.per_slot < kv // 2 * 1.02
    assert 1.9 * plan.slots < fp8.slots < 2.0 * plan.slots


def test_token_history_is_planned_only_when_asked() -> None:
    """Speculative decoding's token history (8 bytes a cache position and slot) is planned only
    with ``history``: without it (the default) every plan is the one before it existed."""
    total = 80 * GiB
    memory = (total - 4 * GiB, total)
    plan = plan_slots(SHAPE, 6000, 1152, True, CHUNK, 0.9, None, memory)
    assert plan_slots(SHAPE, 6000, 1152, True, CHUNK, 0.9, None, memory, history=False) == plan
    kv = 2 * 28 * 2 * 128 * 1152 * 2
    assert plan.per_slot == kv + activation_bytes(SHAPE) + 64  # no history bytes
    spec = plan_slots(SHAPE, 6000, 1152, True, CHUNK, 0.9, None, memory, history=True)
    assert spec.per_slot == plan.per_slot + 8 * 1152
    assert spec.slots == (int(0.9 * total) - 4 * GiB - spec.fixed) // spec.per_slot < plan.slots


QWEN05 = Shape(
    layers=24, kv_heads=2, head_dim=64, hidden=896, inter=4864, q_out=896, vocab=151936,
    itemsize=2, weight_bytes=int(0.99 * GiB), name="qwen2.5-0.5b",
)  # fmt: skip


@pytest.mark.parametrize(
    ("shape", "total_gib", "greedy", "kv_itemsize", "lora_cols", "rows", "positions", "pinned"),
    [
        (SHAPE, 79.2, True, 2, 0, 6000, 2048, (1162, 21711)),
        (SHAPE, 79.2, False, 2, 0, 6000, 2048, (1093, 21711)),
        (SHAPE, 139.8, True, 2, 0, 6000, 2048, (2112, 38324)),
        (SHAPE, 139.8, False, 1, 8192, 6000, 2048, (3722, 38324)),
        (QWEN05, 79.2, True, 2, 0, 6000, 2048, (2799, 39196)),
        (QWEN05, 139.8, False, 2, 0, 6000, 2048, (4347, 69187)),
    ],
)
def test_the_one_activation_formula_keeps_the_planned_slots(
    shape: Shape,
    total_gib: float,
    greedy: bool,
    kv_itemsize: int,
    lora_cols: int,
    rows: int,
    positions: int,
    pinned: tuple[int, int],
) -> None:
    """Slots and prefill chunk tokens as the two formulas (decode rows in the planner, prefill
    tokens in the scheduler) gave them before plan.py's one formula replaced both: computed at
    be7a9ea for H100 / H200 memory (79.2 / 139.8 GiB), the weights plus half a GiB in use."""
    total = int(total_gib * GiB)
    weights = int({"qwen2.5-1.5b": 3.1, "qwen2.5-0.5b": 0.99}[shape.name] * GiB)
    shape = replace(shape, kv_itemsize=kv_itemsize, lora_cols=lora_cols, weight_bytes=weights)
    used = int((weights / GiB + 0.5) * GiB)
    chunk = prefill_tokens(shape, total)
    plan = plan_slots(shape, rows, positions, greedy, chunk, 0.9, None, (total - used, total))
    assert (plan.slots, chunk) == pinned


def test_planner_errors_name_the_keys_and_numbers() -> None:
    total = 16 * GiB
    with pytest.raises(ConfigError) as err:
        plan_slots(SHAPE, 6000, 1152, True, CHUNK, 0.9, None, (total - 13 * GiB, total))
    msg = str(err.value)
    assert err.value.key == "task.max_new_tokens"
    assert "server.gpu_memory_utilization" in msg and "qwen2.5-1.5b" in msg
    assert "bfloat16" in msg and "MiB" in msg
    with pytest.raises(ConfigError) as err:
        plan_slots(SHAPE, 6000, 1152, True, CHUNK, 0.9, 6000, (70 * GiB, 80 * GiB))
    assert err.value.key == "server.max_batch_rows" and "or null" in str(err.value)


def test_a_cpu_plan_that_outgrows_the_host_names_max_batch_rows() -> None:
    """On a CPU every row gets a slot (the count never follows the free memory, so a config
    decodes alike on every machine); slots that do not fit the memory free now are refused
    with a value of server.max_batch_rows that does (the 0.5B's 2,000 eval rows asked a 24 GB
    machine for 74 GiB), and a row that cannot fit at all names task.max_new_tokens."""
    host = (22 * GiB, 24 * GiB)
    unchecked = plan_slots(QWEN05, 2400, 1408, True, CHUNK, 0.9, None, None)
    assert unchecked.slots == 2400  # no host given: every row
    with pytest.raises(ConfigError) as err:
        plan_slots(QWEN05, 2400, 1408, True, CHUNK, 0.9, None, None, host)
    fit = (22 * GiB - (unchecked.fixed - MARGIN)) // unchecked.per_slot  # no graphs on a CPU
    assert err.value.key == "server.max_batch_rows"
    assert f"{fit} rows fit" in str(err.value)
    assert f"server.max_batch_rows={fit} or fewer" in str(err.value)
    assert 0 < fit < 2400
    assert plan_slots(QWEN05, 2400, 1408, True, CHUNK, 0.9, fit, None, host).slots == fit
    assert plan_slots(QWEN05, 40, 1408, True, CHUNK, 0.9, None, None, host).slots == 40
    with pytest.raises(ConfigError) as err:
        plan_slots(QWEN05, 40, 1408, True, CHUNK, 0.9, None, None, (100 * MiB, 8 * GiB))
    assert err.value.key == "task.max_new_tokens" and "not even one row" in str(err.value)


def test_host_memory_is_shared_by_the_ranks_on_it(monkeypatch: pytest.MonkeyPatch) -> None:
    alone, total = host_memory()
    assert 0 < alone <= total
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    shared, _ = host_memory()
    assert shared <= alone // 4 + alone // 20  # the free memory moves a little between reads


class EvalSpy(Callback):
    """Records the generations the mean was evaluated at."""

    def __init__(self) -> None:
        self.evals: list[int] = []

    def on_eval(self, ctx: RunContext, generation: int, samples: Sequence[Sample]) -> None:
        self.evals.append(generation)


def test_a_generation_too_large_stops_the_run_before_its_start_eval(
    tiny_model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's start eval has fewer rows than its generations (here 8 against 2 x 20,001), so
    a memory cap that holds the eval but not a generation stopped runs one eval late (session
    26: a 98 s eval, then `server.max_batch_rows` at generation 1). The loop now checks a
    generation's call first. The host's memory is shared among ``LOCAL_WORLD_SIZE`` ranks;
    that many are set here that this rank holds the eval's rows 10 times over and a
    generation's not at all, on any machine."""
    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), LoraSpec(rank=2))
    engine = LocalEngine(tiny_model_dir, layout, device="cpu")  # no workspace yet
    task = Conciseness(max_new_tokens=900)
    evals = [render(engine, e) for e in task.eval_examples()]
    assert engine.fast is not None
    shape = engine.fast.scheduler.shape(None)
    chunk = prefill_tokens(shape, 0)
    slot = plan_slots(shape, 1, 1024, True, chunk, 0.9, None, None).per_slot
    need = 10 * (len(evals) * slot + chunk * activation_bytes(shape))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(max(1, host_memory()[0] // need)))
    engine.check_rows(evals, len(evals), eval_sampling(task))  # the eval's call fits
    strategy = ES(population_size=20_000, sigma=0.01)
    state = strategy.init([torch.zeros(s) for s in layout.shapes()], seed=0)
    spy = EvalSpy()
    loop = ESLoop(strategy, task, engine, layout, 3, 1, 0, [spy])
    with pytest.raises(ConfigError) as err:
        loop.run(state, RunContext(tmp_path, 3, layout, "tiny"))
    assert err.value.key == "server.max_batch_rows"
    assert f"{2 * 20_001} rows decoding at once" in str(err.value)
    assert spy.evals == [] and engine.fast.scheduler.workspace is None  # nothing ran


def test_buckets_cover_every_batch() -> None:
    for slots in (1, 3, 16, 100, 2000):
        b = buckets(slots)
        assert b[-1] == slots and b[0] == 1 and b == sorted(set(b))
        for n in range(1, slots + 1, max(1, slots // 50)):
            size = next(x for x in b if x >= n)
            assert size - n <= max(slots / 16, n)  # at most a sixteenth (or 2x when small)


def test_bad_batching_settings(tiny_model_dir: str) -> None:
    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), LoraSpec(rank=2))
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        LocalEngine(tiny_model_dir, layout, device="cpu", gpu_memory_utilization=1.5)
    with pytest.raises(ConfigError, match="batching"):
        LocalEngine(tiny_model_dir, layout, device="cpu", batching="paged")
    loads = LocalEngine.loads
    with pytest.raises(ConfigError) as err:
        LocalEngine(tiny_model_dir, layout, device="cpu", kv_cache_dtype="int4")
    assert err.value.key == "kv_cache_dtype" and "fp8" in str(err.value)
    with pytest.raises(ConfigError) as err:  # the lock-step path was removed: said so, and why
        LocalEngine(tiny_model_dir, layout, device="cpu", batching="waves")
    assert err.value.key == "batching" and "continuous batching replaced it" in str(err.value)
    assert LocalEngine.loads == loads  # refused before any model loads
    with pytest.raises(ConfigError, match="fast path"):
        LocalEngine(tiny_model_dir, layout, device="cpu", kv_cache_dtype="fp8", fast=False)


def test_fp8_kv_cache(engine: LocalEngine, tiny_model_dir: str) -> None:
    """``kv_cache_dtype=fp8``: the slots' cache is fp8 (a quarter of fp32's bytes here), K/V are
    rounded as written, so the logits move a little but the greedy tokens stay close to the
    full-precision cache's; a sampled run is reproducible from its seed."""
    fp8 = LocalEngine(tiny_model_dir, engine.layout, device="cpu", kv_cache_dtype="fp8")
    pop = population(engine, 3)
    ids, mask = rows(engine, 3)
    member = torch.arange(3).repeat_interleave(len(PROMPTS))
    sampling = Sampling(max_new_tokens=12)
    args = (ids, mask, pop, sampling)
    ref = generate_ids(engine, *args, member=member, eos_ids=[])
    got = generate_ids(fp8, *args, member=member, eos_ids=[])
    assert fp8.fast is not None and fp8.fast.scheduler.workspace is not None
    cache = fp8.fast.scheduler.workspace.cache
    assert cache.k.dtype == cache.v.dtype == torch.float8_e4m3fn
    assert engine.fast is not None and engine.fast.scheduler.workspace is not None
    assert engine.fast.scheduler.workspace.cache.k.element_size() == 4 * cache.k.element_size()
    assert cache.k.float().abs().sum() > 0  # written through the rounding copy
    agree = (got == ref).float().mean().item()
    assert agree >= 0.5, agree  # rounding flips near-ties; the runs stay alike
    # first-token logits: the prompt's K/V are rounded to fp8, the difference is small
    model, ws = fp8.fast.scheduler.model, fp8.fast.scheduler.workspace
    full = engine.fast.scheduler.model
    row = torch.tensor([0])
    pos = (mask[:1].long().cumsum(-1) - 1).clamp(min=0)
    cos, sin = ws.cos[pos], ws.sin[pos]
    with torch.inference_mode():
        ref_cache = full.new_cache(1, ws.positions)
        fp8_cache = model.new_cache(1, ws.positions, torch.float8_e4m3fn)
        a = full.prefill(ids[:1], cos, sin, None, ref_cache, row, None)
        b = model.prefill(ids[:1], cos, sin, None, fp8_cache, row, None)
        assert torch.equal(a, b)  # prefill attends to its own (unrounded) K/V
        rounded = ref_cache.k.to(torch.float8_e4m3fn).float()
        assert torch.equal(fp8_cache.k.float(), rounded)  # the cache holds K rounded to fp8
    sampled = Sampling(max_new_tokens=8, temperature=1.0)
    sargs = (ids, mask, pop, sampled)
    runs = [
        generate_ids(fp8, *sargs, torch.Generator().manual_seed(5), member=member, eos_ids=[])
        for _ in range(2)
    ]
    assert torch.equal(runs[0], runs[1])
