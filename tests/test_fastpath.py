"""The fast path (fused projections, grouped LoRA, static cache, graph decode) == the HF path.

Reference: the transformers model with MultiLoraLinear on every target projection, one forward
over prompt + forced tokens. Tolerance on CPU fp32: max |logit diff| <= 1e-4 (logits are O(1-10);
the two paths order the same float32 sums differently, so bit-equality is not expected).
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from benchmarks.harness import from_model, generate_ids
from benchmarks.shapes import build_model
from evolm.engine.fast.lora import FastLora, GroupLora, RankActs, lora_delta, operand, project
from evolm.engine.fast.runner import member_runs
from evolm.engine.hf.multilora import load_population
from evolm.engine.kernels import tile_members
from evolm.engine.local import LocalEngine
from evolm.es import ES
from evolm.lora import LoraLayout, LoraPopulation, LoraSpec
from evolm.sampling import Sampling

CPU = torch.device("cpu")
TOL = 1e-4


def population(layout: LoraLayout, members: int, sigma: float = 0.3) -> LoraPopulation:
    es = ES(population_size=members, sigma=sigma)
    gen = torch.Generator().manual_seed(5)
    state = es.init([torch.randn(s, generator=gen) * 0.1 for s in layout.shapes()], seed=2)
    return LoraPopulation(layout, tuple(es.sample(state, es.ask(state))))


def left_padded(rows: int, length: int, vocab: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (rows, length), generator=gen)
    lengths = torch.randint(2, length + 1, (rows,), generator=gen)
    lengths[0] = length
    mask = (torch.arange(length)[None] >= length - lengths[:, None]).long()
    return ids * mask, mask


def hf_reference(
    engine: LocalEngine, pop: LoraPopulation | None, ids, mask, forced
) -> torch.Tensor:
    full = torch.cat([ids, forced], dim=1)
    fmask = torch.cat([mask, torch.ones_like(forced)], dim=1)
    load_population(engine.layers, pop, engine.device, engine.dtype)
    try:
        with torch.inference_mode():
            logits = engine.model(
                input_ids=full,
                attention_mask=fmask,
                position_ids=(fmask.cumsum(-1) - 1).clamp(min=0),
            ).logits
    finally:
        load_population(engine.layers, None, engine.device, engine.dtype)
    return logits[:, ids.shape[1] - 1 :]


def check_forced(engine: LocalEngine, pop: LoraPopulation | None, prompts: int = 3) -> float:
    members = 1 if pop is None else len(pop)
    vocab = engine.model.config.vocab_size
    ids, mask = left_padded(prompts, 9, vocab)
    ids, mask = ids.repeat(members, 1), mask.repeat(members, 1)
    forced = torch.randint(0, vocab, (ids.shape[0], 5), generator=torch.Generator().manual_seed(1))
    assert engine.fast is not None
    ours = engine.fast.forced_logits(
        ids.to(engine.device), mask.to(engine.device), pop, forced.to(engine.device)
    )
    ref = hf_reference(
        engine, pop, ids.to(engine.device), mask.to(engine.device), forced.to(engine.device)
    )
    return (ours - ref).abs().max().item()


@pytest.fixture(scope="module")
def qwen() -> torch.nn.Module:
    return build_model("tiny", CPU, torch.float32, seed=3)


@pytest.mark.parametrize(
    "spec",
    [
        LoraSpec(rank=3, alpha=6.0),
        LoraSpec(rank=2, target_modules=["q_proj", "v_proj", "down_proj"], target_layers=[1]),
        LoraSpec(rank=1, target_modules=["k_proj", "up_proj", "o_proj"]),
    ],
)
def test_forced_logits_equal_hf_multilora(qwen: torch.nn.Module, spec: LoraSpec) -> None:
    """Padded prompts, prefill in chunks of one row, then 5 decode steps."""
    layout = LoraLayout.from_hf_config(qwen.config, spec)
    engine = from_model(qwen, layout, fast=True)
    assert engine.fast is not None
    engine.fast.scheduler.prefill_tokens = 1  # many chunks
    assert check_forced(engine, population(layout, 3)) <= TOL
    assert check_forced(engine, None) <= TOL


def llama_model(smol: bool = True, seed: int = 0) -> torch.nn.Module:
    """A random tiny Llama: ``smol`` is SmolLM2-135M's layout at small size (9 query heads over
    3 KV heads, tied embeddings, rope_theta 1e5, eps 1e-5, a hidden size that is no power of
    two); otherwise LlamaConfig's defaults (untied) at 4 / 2 heads."""
    heads = dict(num_attention_heads=9, num_key_value_heads=3) if smol else {}
    cfg = LlamaConfig(
        vocab_size=512,
        hidden_size=9 * 32 if smol else 64,
        intermediate_size=192 if smol else 128,
        num_hidden_layers=2,
        max_position_embeddings=256,
        **(heads or dict(num_attention_heads=4, num_key_value_heads=2)),
        **(dict(tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5) if smol else {}),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    assert model.config.tie_word_embeddings == smol
    return model


@pytest.mark.parametrize("smol", [False, True], ids=["llama", "smollm2-like"])
def test_llama_without_biases_matches_too(smol: bool) -> None:
    model = llama_model(smol)
    layout = LoraLayout.from_hf_config(model.config, LoraSpec(rank=2))
    engine = from_model(model, layout, fast=True)
    assert check_forced(engine, population(layout, 2)) <= TOL
    assert check_forced(engine, None) <= TOL


def test_generation_equals_hf_path(qwen: torch.nn.Module) -> None:
    layout = LoraLayout.from_hf_config(qwen.config, LoraSpec(rank=2))
    fast = from_model(qwen, layout, fast=True)
    ids, mask = left_padded(4, 7, qwen.config.vocab_size, seed=4)
    pop = population(layout, 3)
    rows, masks = ids.repeat(3, 1), mask.repeat(3, 1)
    sampling = Sampling(max_new_tokens=12)
    ours = generate_ids(fast, rows, masks, pop, sampling, eos_ids=[])
    slow = from_model(qwen, layout, fast=False)
    theirs = generate_ids(slow, rows, masks, pop, sampling, eos_ids=[])
    assert ours.shape == (12, 12) and torch.equal(ours, theirs)
    hot = Sampling(max_new_tokens=12, temperature=1.0)
    a = generate_ids(fast, rows, masks, pop, hot, torch.Generator().manual_seed(3), eos_ids=[])
    b = generate_ids(fast, rows, masks, pop, hot, torch.Generator().manual_seed(3), eos_ids=[])
    assert torch.equal(a, b)


@pytest.mark.parametrize("in_weights", [False, True])
@pytest.mark.parametrize("targets", [["q_proj", "k_proj", "v_proj"], ["q_proj", "v_proj"]])
def test_grouped_lora_equals_each_module_alone(in_weights: bool, targets: list[str]) -> None:
    """Grouped LoRA over a fused (q, k, v) weight == separate x W^T + s x A^T B^T per module,
    with A in its own buffer (u by bmm) or in the weight buffer's spare rows (u from the base
    GEMM), a module left out, and members 1..2 as a prefill-style member range."""
    gen = torch.Generator().manual_seed(0)
    members, rows, hidden, outs, r, s = 3, 4, 16, (16, 8, 8), 2, 1.5
    x = torch.randn(members * rows, hidden, generator=gen)
    w = [torch.randn(o, hidden, generator=gen) for o in outs]
    names = ["q_proj", "k_proj", "v_proj"]
    a = {m: torch.randn(members, r, hidden, generator=gen) for m in targets}
    b = {
        m: torch.randn(members, o, r, generator=gen)
        for m, o in zip(names, outs, strict=True)
        if m in a
    }
    layout = LoraLayout.from_hf_config(
        LlamaConfig(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        ),
        LoraSpec(rank=r, alpha=r * s, target_modules=targets),
    )
    weight = torch.cat([*w, torch.full((40, hidden), float("nan"))])  # spare rows
    weight[sum(outs) :] = 0
    spare = (lambda _l, _g, n: weight[sum(outs) : sum(outs) + n]) if in_weights else None
    lora = FastLora(layout, members, {"qkv": hidden}, {"qkv": outs}, CPU, torch.float32, 8, spare)
    pop = LoraPopulation(layout, tuple(t for m in targets for t in (a[m], b[m])))
    lora.load(pop)
    lora.load(pop)  # a reload overwrites (the scaling is applied once)
    xs = x.view(members, rows, hidden)
    want = torch.cat(
        [
            (x @ wi.T).view(members, rows, -1) + (s * xs @ a[m].mT @ b[m].mT if m in a else 0)
            for m, wi in zip(names, w, strict=True)
        ],
        dim=-1,
    ).view(members * rows, -1)
    g = lora.get(0, "qkv")
    assert (g.spare > 0) == in_weights  # A in the weights: u from the base GEMM
    base, u = project(x, weight, None, sum(outs), g)
    got = base + lora_delta(u, g)
    assert (got - want).abs().max().item() <= 1e-4
    # continuous batching: rows of any member in any order, each naming its member; and rows
    # sorted by member in runs (eager prefill: one GEMM per member's run when A has its own
    # buffer, u of its own member only)
    member = torch.arange(members).repeat_interleave(rows)
    perm = torch.randperm(members * rows, generator=gen)
    g = lora.rows(member[perm]).get(0, "qkv")
    base, u = project(x[perm], weight, None, sum(outs), g)
    assert (base + lora_delta(u, g) - want[perm]).abs().max().item() <= 1e-4
    runs = member_runs(member.tolist(), 1)
    assert runs == tuple((m, m * rows, (m + 1) * rows) for m in range(members))
    g = lora.runs(member, runs).get(0, "qkv")
    base, u = project(x, weight, None, sum(outs), g)
    assert (u.member_stride == 0) != in_weights  # own columns only, or every member's
    assert (base + lora_delta(u, g) - want).abs().max().item() <= 1e-4


def test_workspace_is_reused_for_the_same_shape(qwen: torch.nn.Module) -> None:
    layout = LoraLayout.from_hf_config(qwen.config, LoraSpec(rank=2))
    engine = from_model(qwen, layout, fast=True)
    ids = torch.randint(3, 100, (6, 5))

    def run(new: int, rows: torch.Tensor) -> None:
        sampling = Sampling(max_new_tokens=new)
        generate_ids(engine, rows, torch.ones_like(rows), None, sampling, eos_ids=[])

    assert engine.fast is not None  # the slot workspace: kept while the rows fit in it
    run(4, ids)
    slots = engine.fast.scheduler.workspace
    run(3, ids)  # same rows and (rounded) positions: same plan, same buffers and graphs
    assert engine.fast.scheduler.workspace is slots
    run(4, ids[:4])  # fewer rows: they fit in the slots there are
    assert engine.fast.scheduler.workspace is slots
    run(40, ids)  # more positions than its cache has: planned again
    assert engine.fast.scheduler.workspace is not slots


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("ops", ["triton", "eager"])
@pytest.mark.parametrize("prompts", [3, 16])  # rows per member: 1-row or 16-row kernel programs
def test_cuda_graph_decode_equals_hf_fp32(ops: str, prompts: int) -> None:
    """On a GPU in fp32: the graph-replayed decode against the HF reference (<= 1e-3)."""
    model = build_model("tiny", torch.device("cuda"), torch.float32, seed=3)
    layout = LoraLayout.from_hf_config(model.config, LoraSpec(rank=3))
    engine = from_model(model, layout, fast=True)
    assert engine.fast is not None
    engine.fast.scheduler.model.set_ops(ops)
    assert engine.fast.scheduler.runner.graphs
    assert check_forced(engine, population(layout, 3), prompts) <= 1e-3
    assert check_forced(engine, None, prompts) <= 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("ops", ["triton", "eager"])
def test_cuda_graph_decode_equals_hf_fp32_smollm2_shape(ops: str) -> None:
    """The same on a SmolLM2-shaped Llama (tied embeddings, 9 / 3 heads, no q/k/v bias)."""
    model = llama_model(smol=True).to("cuda")
    layout = LoraLayout.from_hf_config(model.config, LoraSpec(rank=3))
    engine = from_model(model, layout, fast=True)
    assert engine.fast is not None
    engine.fast.scheduler.model.set_ops(ops)
    assert check_forced(engine, population(layout, 3), 16) <= 1e-3
    assert check_forced(engine, None, 3) <= 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_ops_equal_torch_bf16() -> None:
    """The Triton kernels (LoRA-fused variants too) on bf16 inputs against the torch ops in
    fp32 on the same inputs: within a few bf16 roundings (2e-2 of the largest value)."""
    check_triton_ops(torch.device("cuda"), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("g", [7, 6, 3])  # query heads a KV head: Qwen2.5-0.5B, 1.5B, SmolLM2
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_verify_rows_attention_bit_equal_on_gpu(g: int, kv: str) -> None:
    """Speculation's verify rows (runs of one slot's consecutive positions, several rows a
    program) get exactly the attention of one-row programs, the plain decode step's: the
    greedy tokens of speculation equal plain decoding's only if no bit differs. Four runs
    reach the cache's end, their last rows capped at its last position (equal ends)."""
    from evolm.engine.kernels.attention import slot_attention

    dev = torch.device("cuda")
    gen = torch.Generator(dev).manual_seed(g)
    cache = torch.randn(2, 40, 2, 1500, 64, generator=gen, device=dev).to(torch.bfloat16)
    if kv == "fp8":
        cache = cache.to(torch.float8_e4m3fn)
    sel = torch.randperm(40, generator=gen, device=dev)[:24]
    lo = torch.randint(0, 200, (24,), generator=gen, device=dev)
    pos = lo + torch.randint(1, 1200, (24,), generator=gen, device=dev)
    pos[:4] = 1497
    for span in (2, 4, 5, 9):
        hi = (pos[:, None] + torch.arange(span, device=dev) + 1).clamp(max=1500).reshape(-1)
        rows = sel.repeat_interleave(span), lo.repeat_interleave(span)
        q = torch.randn(len(hi), 2, g, 64, generator=gen, device=dev).to(torch.bfloat16)
        runs = slot_attention(q, cache[0], cache[1], rows[0], rows[1], hi, span=span)
        one = slot_attention(q, cache[0], cache[1], rows[0], rows[1], hi)
        assert torch.equal(runs, one), (span, (runs.float() - one.float()).abs().max().item())


def check_triton_ops(dev: torch.device, bf16: torch.dtype) -> None:
    """Every Triton kernel against torch on ``dev`` in ``bf16`` (fp32 where interpreted)."""
    import torch.nn.functional as F

    from evolm.engine.fast import ops as fastops
    from evolm.engine.kernels import attention as triton_attention
    from evolm.engine.kernels import fused as triton_ops

    gen = torch.Generator(dev).manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=dev).to(bf16)

    def close(ours: torch.Tensor, ref: torch.Tensor) -> bool:
        return (ours.float() - ref).abs().max().item() <= 2e-2 * ref.abs().max().item()

    q = rand(96, 44 * 128)[:, : 28 * 128].view(96, 4, 7, 128)
    k, v = rand(96, 4, 192, 128)[:, :, :160], rand(96, 4, 192, 128)[:, :, :160]
    bias = torch.zeros(96, 160, device=dev)
    bias[:, 100:] = torch.finfo(bf16).min
    bias[::3, :20] = torch.finfo(bf16).min
    ref = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=bias[:, None, None]
    )
    assert close(triton_attention.decode_attention(q, k, v, bias.to(bf16)), ref.reshape(96, -1))
    gu = rand(300, 2 * 4864)
    assert close(triton_ops.silu_mul(gu), fastops.silu_mul(gu.float()))
    members, rpm, r = 4, 32, 4

    def group(out: tuple[int, ...], offsets: tuple[int, ...], rank: int = r) -> GroupLora:
        a = torch.empty(members, rank * len(out), 1, device=dev, dtype=bf16)  # shape only
        return GroupLora(a, rand(members, rank, sum(out)) * 0.1, offsets, out)

    def acts(g: GroupLora) -> RankActs:  # u inside a wider GEMM output, as in the fast path
        wide = rand(members * rpm, 40 + members * g.cols)
        return RankActs(wide[:, 40:], g.cols)

    def want_delta(u: RankActs, g: GroupLora) -> torch.Tensor:
        f32 = GroupLora(g.A, g.Bt.float(), g.offsets, g.splits, member=g.member)
        return lora_delta(RankActs(u.u.float(), u.member_stride), f32)

    # continuous batching: each row names its member, in any order or sorted by member (a tile
    # of one member reads its Bt once; a tile of several takes one pass per member)
    shuffled = torch.randint(0, members, (members * rpm,), generator=gen, device=dev)
    ordered = torch.sort(shuffled).values
    assert (ordered[:-1] != ordered[1:]).any()  # both kinds of tiles
    # the tiles' one member found up front (as FastLora.rows does on GPUs), or row by row
    tiles = tile_members(ordered)
    assert (tiles >= 0).any() and (tiles < 0).any()
    by_row = [
        (shuffled, None),
        (ordered, None),
        (ordered, tiles),
        (shuffled, tile_members(shuffled)),
    ]

    gu = rand(members * rpm, 2 * 4864 + 8)[:, : 2 * 4864]  # strided rows
    for rank in (r, 20):  # 20: more rank columns than one 16-wide tl.dot tile
        g = group((4864, 4864), (rank, 0), rank)  # up's rank columns first: offsets honoured
        u = acts(g)
        want = fastops.silu_mul(gu.float() + want_delta(u, g))
        for dot in (0, 1):  # rank products as FMA updates, or tl.dot
            tuned = triton_ops.TUNE["silu"]
            triton_ops.TUNE["silu"] = {**tuned, "dot": dot}
            try:
                assert close(triton_ops.silu_mul(gu, operand(u, g)), want), (rank, dot)
            finally:
                triton_ops.TUNE["silu"] = tuned
        for (member, tiles), loop in itertools.product(by_row, (0, 2)):
            gm = replace(g, member=member, tiles=tiles)
            want_m = fastops.silu_mul(gu.float() + want_delta(u, gm))
            tuned = triton_ops.TUNE["silu"]
            # programs over column blocks, or one block each
            triton_ops.TUNE["silu"] = {**tuned, "loop": loop, "loop_rows": 0}
            try:
                assert close(triton_ops.silu_mul(gu, operand(u, gm)), want_m), (rank, loop)
            finally:
                triton_ops.TUNE["silu"] = tuned
    x = rand(members * rpm, 44 * 64)[:, : 36 * 64]  # 28 q, 4 k, 4 v heads
    cos, sin = rand(members * rpm, 1, 64).clamp(-1, 1), rand(members * rpm, 1, 64).clamp(-1, 1)
    g = group((28 * 64, 4 * 64, 4 * 64), (0, -1, 4))  # k not adapted: its Bt columns are 0
    g.Bt[:, :, 28 * 64 : 32 * 64] = 0
    u = acts(g)
    full = (x.float() + want_delta(u, g)).view(-1, 36, 64)
    want = torch.cat([fastops.rope(full[:, :32], cos.float(), sin.float()), full[:, 32:]], 1)
    kc, vc = torch.zeros(2, members * rpm, 4, 8, 64, device=dev, dtype=bf16)
    slot = torch.tensor([5], device=dev)
    for dot in (1, 0):
        tuned = triton_ops.TUNE["rope"]
        triton_ops.TUNE["rope"] = {**tuned, "dot": dot}
        try:
            got = triton_ops.qkv_rope(
                x.view(-1, 36, 64), cos, sin, 32, operand(u, g), (kc, vc, slot)
            )
        finally:
            triton_ops.TUNE["rope"] = tuned
        assert close(got, want), dot
    assert torch.equal(kc[:, :, 5], got[:, 28:32]) and torch.equal(vc[:, :, 5], got[:, 32:])
    assert kc[:, :, :5].abs().sum() == 0 and vc[:, :, 6:].abs().sum() == 0
    for member, tiles in by_row:
        gm = replace(g, member=member, tiles=tiles)
        full_m = (x.float() + want_delta(u, gm)).view(-1, 36, 64)
        rot = fastops.rope(full_m[:, :32], cos.float(), sin.float())
        got_m = triton_ops.qkv_rope(x.view(-1, 36, 64), cos, sin, 32, operand(u, gm))
        assert close(got_m, torch.cat([rot, full_m[:, 32:]], 1))
    hidden, w = 896, rand(896)
    g = group((hidden,), (0,))
    u, y = acts(g), rand(members * rpm, hidden + 24)[:, :hidden]
    res = rand(members * rpm, hidden)
    ref = res.float() + y.float() + want_delta(u, g)
    h = triton_ops.add_rms_norm(res, w, 1e-6, y, operand(u, g))
    assert close(res, ref)  # the residual stream, updated in place
    assert close(h, F.rms_norm(ref, (hidden,), w.float(), 1e-6))
    for member, tiles in by_row:  # rows naming members (one row per program; tiles unused)
        gm = replace(g, member=member, tiles=tiles)
        res_m = rand(members * rpm, hidden)
        ref_m = res_m.float() + y.float() + want_delta(u, gm)
        h_m = triton_ops.add_rms_norm(res_m, w, 1e-6, y, operand(u, gm))
        assert close(res_m, ref_m) and close(h_m, F.rms_norm(ref_m, (hidden,), w.float(), 1e-6))
    assert close(
        triton_ops.add_rms_norm(res.clone(), w, 1e-6),
        F.rms_norm(res.float(), (hidden,), w.float(), 1e-6),
    )


def test_tile_members_marks_tiles_of_one_member() -> None:
    """Each 16-row tile's one member, or -1; a partial last tile counts only its rows."""
    m = torch.tensor([0] * 16 + [1] * 10 + [2] * 6 + [3] * 3)
    assert tile_members(m).tolist() == [0, -1, 3]
    assert tile_members(torch.full((19,), 2)).tolist() == [2, 2]
    pairs = torch.zeros(32, 2, dtype=torch.long)
    pairs[16:, 0] = 1
    assert tile_members(pairs[:, 0]).tolist() == [0, 1]  # a strided column
    assert tile_members(torch.zeros(0, dtype=torch.long)).numel() == 0


def test_second_engine_on_a_model_with_spare_rows(qwen: torch.nn.Module) -> None:
    """A buffer grown for LoRA first factors (spare rows) is reused by a later fast model on the
    same HF model, whose projections still cover only the model's own rows."""
    from evolm.engine.fast.model import FastModel
    from evolm.engine.fast.weights import base_linear

    first = FastModel(qwen)
    rows = first.spare_rows(0, "qkv", 24)
    assert first.weights_version == 1 and rows.shape[0] == 24
    proj = first.layers[0].qkv
    assert proj.out == first.q_out + 2 * first.kv_out < proj.weight.shape[0]
    q = base_linear(qwen.model.layers[0].self_attn.q_proj)
    assert q.weight.data_ptr() == proj.weight.data_ptr()  # the HF weights are views of it
    second = FastModel(qwen)
    assert second.layers[0].qkv.out == proj.out
    assert second.layers[0].qkv.weight.data_ptr() == proj.weight.data_ptr()
    x = torch.randn(3, first.hidden)
    base, u = second.layers[0].qkv.project(x, None)
    assert u is None and base.shape == (3, proj.out)
