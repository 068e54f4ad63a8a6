"""Triton decode attention for the fast path (GPU; importing needs ``triton``).

:func:`decode_attention`: one query token per row against the static cache, the ``g`` query
heads of a KV head handled together (GQA), streaming K and V once with an online softmax.
cuDNN's SDPA kernel pads the ``g`` queries to a 64-row tile and reached ~45% of HBM bandwidth
here; this reads each cache byte once per step. ``TRITON_INTERPRET=1`` runs it on CPU tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, bias_ptr, out_ptr,
    sq_r, sq_h, sq_g, sk_r, sk_h, sk_n, sv_r, sv_h, sv_n, sb_r, so_r, so_h, so_g,
    kv_heads, slots, scale,
    G: tl.constexpr, G_PAD: tl.constexpr, HD: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    r, h = pid // kv_heads, pid % kv_heads
    offs_g, offs_d = tl.arange(0, G_PAD), tl.arange(0, HD)
    g_ok = offs_g[:, None] < G
    q = tl.load(q_ptr + r * sq_r + h * sq_h + offs_g[:, None] * sq_g + offs_d[None, :], mask=g_ok)
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, HD], tl.float32)
    for start in range(0, slots, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < slots
        kv_off = offs_n[:, None] * sk_n + offs_d[None, :]
        k = tl.load(k_ptr + r * sk_r + h * sk_h + kv_off, mask=n_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        b = tl.load(bias_ptr + r * sb_r + offs_n, mask=n_ok, other=float("-inf"))
        s = s * scale + b.to(tl.float32)[None, :]
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v_off = offs_n[:, None] * sv_n + offs_d[None, :]
        v = tl.load(v_ptr + r * sv_r + h * sv_h + v_off, mask=n_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = acc / l_i[:, None]
    o_off = r * so_r + h * so_h + offs_g[:, None] * so_g + offs_d[None, :]
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=g_ok)


def decode_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Tensor:
    """``q [R, kv_heads, g, hd]`` against ``k``/``v [R, kv_heads, E, hd]`` with the additive
    ``bias [R, E]``; returns ``[R, kv_heads * g * hd]`` (softmax scale ``hd ** -0.5``)."""
    rows, kv_heads, g, hd = q.shape
    slots = k.shape[2]
    out = torch.empty(rows, kv_heads, g, hd, dtype=q.dtype, device=q.device)
    g_pad = max(16, triton.next_power_of_2(g))
    _decode_attention_kernel[(rows * kv_heads,)](
        q, k, v, bias, out,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), bias.stride(0),
        out.stride(0), out.stride(1), out.stride(2),
        kv_heads, slots, hd**-0.5,
        G=g, G_PAD=g_pad, HD=hd, BLOCK_N=32,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=4,
    )  # fmt: skip
    return out.view(rows, -1)


@triton.jit
def _slot_attention_kernel(
    q_ptr, k_ptr, v_ptr, sel_ptr, lo_ptr, hi_ptr, out_ptr,
    sq_r, sq_h, sq_g, sk_r, sk_h, sk_n, sv_r, sv_h, sv_n, so_r, so_h, so_g,
    kv_heads, scale,
    G: tl.constexpr, SPAN: tl.constexpr, CHUNK: tl.constexpr, M_PAD: tl.constexpr,
    HD: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, FP8: tl.constexpr,
):  # fmt: skip
    # one program per (chunk of CHUNK rows of a run of SPAN rows, KV head): the chunk's
    # CHUNK x G queries, which share a slot and ``lo`` and whose ends never fall, against the
    # slot's cache read once (SPAN = CHUNK = 1: a row's G query heads of the KV head)
    pid = tl.program_id(0)
    chunks = (SPAN + CHUNK - 1) // CHUNK
    h, chunk = pid % kv_heads, (pid // kv_heads) % chunks
    first = (pid // kv_heads // chunks) * SPAN + chunk * CHUNK
    count = tl.minimum(CHUNK, SPAN - chunk * CHUNK)  # the last chunk of a run may be short
    slot = tl.load(sel_ptr + first).to(tl.int64)
    lo = tl.load(lo_ptr + first).to(tl.int32)
    hi_last = tl.load(hi_ptr + first + count - 1).to(tl.int32)
    offs_m, offs_d = tl.arange(0, M_PAD), tl.arange(0, HD)
    m_ok = offs_m < count * G
    row, head = first + offs_m // G, offs_m % G
    # each query's own end; padding queries take the last one's (never an all-masked row)
    hi = tl.where(m_ok, tl.load(hi_ptr + row, mask=m_ok, other=0).to(tl.int32), hi_last)
    q_off = row[:, None] * sq_r + h * sq_h + head[:, None] * sq_g + offs_d[None, :]
    q = tl.load(q_ptr + q_off, mask=m_ok[:, None], other=0.0)
    if FP8:  # an fp8 cache: products in fp16, the one type fp8 widens to in one instruction
        q = q.to(tl.float16)
    m_i = tl.full([M_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([M_PAD], tl.float32)
    acc = tl.zeros([M_PAD, HD], tl.float32)
    k_row = k_ptr + slot * sk_r + h * sk_h
    v_row = v_ptr + slot * sv_r + h * sv_h
    for start in range(lo, hi_last, BLOCK_N):  # the first block holds every query's ``lo``
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < hi_last
        k = tl.load(k_row + offs_n[:, None] * sk_n + offs_d[None, :], mask=n_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=PRECISION)
        s = tl.where(offs_n[None, :] < hi[:, None], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_row + offs_n[:, None] * sv_n + offs_d[None, :], mask=n_ok[:, None], other=0.0)
        pv = tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = acc / l_i[:, None]
    o_off = row[:, None] * so_r + h * so_h + head[:, None] * so_g + offs_d[None, :]
    tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=m_ok[:, None])


MIN_TILE = 16  # tl.dot's smallest
SLOT_TUNE = {"block_n": 64, "warps": 4, "stages": 3, "tile": MIN_TILE}  # H200: 4.0 TB/s (slot_tune)
# an fp8 cache (H100, 1.5B shape, 1,600 rows): 0.235 ms per layer against bf16's 0.377; on an
# H200 at 6,000 rows (``slot_tune --kv fp8 --rows 6000``) 2 warps: 0.627 vs 0.666 ms (3.1 TB/s:
# widening fp8 to fp16 and the g-row dots, not HBM, bound it)
SLOT_TUNE_FP8 = {"block_n": 64, "warps": 2, "stages": 3, "tile": MIN_TILE}
# "tile": a program's query rows at least (``query_tile``); plain and verify programs share it,
# so a 64-row tile would put a 0.5B row's 5 verify rows in one program (one cache read) and
# every plain row's 7 queries in 64 rows: ``slot_tune tiles`` times both


def slot_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    sel: Tensor,
    lo: Tensor,
    hi: Tensor,
    tune: dict[str, int] | None = None,
    span: int = 1,
) -> Tensor:
    """Continuous batching's decode attention: ``q [B, kv_heads, g, hd]``; row ``b`` attends
    over positions ``lo[b] <= n < hi[b]`` of cache row ``sel[b]`` of ``k``/``v [C, kv_heads,
    T, hd]`` (no mask tensor: each row streams only its own length). ``[B, kv_heads*g*hd]``.
    An fp8 cache (``torch.float8_e4m3fn``) is widened to fp16 as it is read.

    ``span > 1``: the rows come in runs of ``span`` (``B`` a multiple of it) that share a slot
    and ``lo`` and whose ``hi`` never fall (speculative decoding's verify rows: a row's current
    token and drafts, one position apart, the last ones equal where capped at the slot's end).
    A program takes as many of a run's rows as fill the query tile that one row's ``g``
    queries take (:func:`verify_chunk`: 2 rows at ``g`` = 7), each query masked to its own
    ``hi``, and reads the slot's cache once for them. The tile's height fixes the
    tensor-core instruction and the order of the softmax's sums, so each row's result is
    bit-equal to its one-row program's (a first version put a whole run's ``span x g``
    queries in one tile: on an H100, 64 rows took ``wgmma`` where 16 take ``mma.sync``, and
    1.5% of the greedy answers changed)."""
    rows, kv_heads, g, hd = q.shape
    fp8 = k.element_size() == 1
    t = tune or (SLOT_TUNE_FP8 if fp8 else SLOT_TUNE)
    out = torch.empty(rows, kv_heads, g, hd, dtype=q.dtype, device=q.device)
    if rows % span:
        raise ValueError(f"{rows} rows are not runs of {span}")
    least = t.get("tile", MIN_TILE)
    tile, chunk = query_tile(g, least), min(span, verify_chunk(g, least))
    programs = rows // span * -(-span // chunk) * kv_heads
    _slot_attention_kernel[(programs,)](
        q, k, v, sel, lo, hi, out,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        kv_heads, hd**-0.5,
        G=g, SPAN=span, CHUNK=chunk, M_PAD=tile, HD=hd,
        BLOCK_N=t["block_n"], PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        FP8=fp8, num_warps=t["warps"], num_stages=t["stages"],
    )  # fmt: skip
    return out.view(rows, -1)


def query_tile(g: int, least: int = MIN_TILE) -> int:
    """The query rows of a slot-attention program's tile: one row's ``g`` query heads, padded
    to a power of two of at least ``least`` (the tuning's ``tile``)."""
    return max(least, triton.next_power_of_2(g))


def verify_chunk(g: int, least: int = MIN_TILE) -> int:
    """Verify rows a slot-attention program takes at once: as many as one row's tile holds."""
    return max(1, query_tile(g, least) // g)
