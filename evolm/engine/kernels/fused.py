"""Triton kernels for the fast path's memory-bound steps (GPU; importing needs ``triton``).

- decode attention: :mod:`evolm.engine.kernels.attention`.
- :func:`silu_mul`: ``silu(gate) * up`` from the fused gate/up output, one pass.
- :func:`qkv_rope`: HF's rotary embedding on the q and k heads of the fused qkv output, one
  pass, k and v written into the decode cache.
- :func:`add_rms_norm`: the residual add of the o / down output and RMSNorm, one kernel.

The LoRA variants add each row's member's delta ``u_j Bt_j``
(:class:`evolm.engine.kernels.LoraOperand`) inside the same pass, so a LoRA layer launches no
more kernels than a base one.

All compute in float32 and round once. ``TRITON_INTERPRET=1`` runs them on CPU tensors (tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from evolm.engine.kernels import TILE_ROWS, LoraOperand

TUNE: dict[str, dict[str, int]] = {
    # launch settings of the LoRA-fused kernels, from ``python -m benchmarks.kernels`` on an
    # H200 (0.5B and 7B shapes, 30 x 32 rows, rank 4): at most ``rows`` rows per program (a
    # power of two dividing the rows per member), tile elements per program, warps, and 1 to
    # apply the rank products with ``tl.dot`` (on 16-row programs or more; else rank-1 FMAs).
    # SiLU: tl.dot 9.2 us vs FMA 11.3 us (base 6.0); RoPE: FMA on 16 rows 3.7 us vs 4.2-5.4.
    # Since 2026-11-26 tuned on continuous batching's rows (each names its member, batches
    # sorted by member): SiLU 16-row programs, 4 warps: 0.5B 11.4 vs 12.7 us (base 6.7), 1.5B
    # shape at 6,000 rows 128 vs 157 us (base 82).
    # Small batches (<= "few" rows) do better with more, smaller programs: 0.5B 9.8 vs 10.7 us.
    # "loop": column blocks per program where rows name their members, for batches of more
    # than "loop_rows" rows (the tile's member and u read once, the loop's loads pipelined):
    # 0.5B prefill (61,440 rows) 604 vs 768 us (base 457), 1.5B 6,000 rows 122 vs 131 us.
    # Smaller batches keep one block per program: W-real 1.5B variable (decode batches of
    # 234-3,733 rows) took 24.64 s with the loop from 2,048 rows up, 24.02 s without.
    "silu": {
        "rows": 16,
        "elems": 4096,
        "warps": 4,
        "dot": 1,
        "few": 2048,
        "few_elems": 2048,
        "loop": 8,
        "loop_rows": 4096,
        "stages": 3,
    },
    "rope": {"rows": 16, "warps": 4, "dot": 0},
    "norm": {"warps": 0},  # 0: one warp per 256 columns (best of 1-8)
}


def row_block(rows_per_member: int) -> int:
    """Rows a fused-LoRA RoPE / SiLU program covers: a power of two <= 32 that divides the rows
    per member, so a program's rows share one member's adapters."""
    return min(32, rows_per_member & -rows_per_member)


def _lora_args(
    lora: LoraOperand | None, like: Tensor
) -> tuple[Tensor, Tensor, int, int, int, int, int, tuple[int, ...]]:
    """Pointers, strides, rank and the modules' u offsets of an optional LoRA operand."""
    if lora is None:
        return like, like, 0, 0, 0, 0, 1, (0, 0, 0)
    u, bt = lora.u, lora.bt
    offs = (*(max(o, 0) for o in lora.offsets), 0, 0)
    return u, bt, u.stride(0), lora.u_member_stride, bt.stride(0), bt.stride(1), bt.shape[1], offs


def _tiling(
    lora: LoraOperand | None, rows: int, per_row: bool, has_tiles: bool, tune: dict[str, int]
) -> tuple[int, int]:
    """``(rows per member, Bt rows per tile)`` of a fused kernel's LoRA over ``rows`` rows:
    member-major rows take blocks of a member's rows; rows of any members (``per_row``) take
    one pass per member among a tile's rows."""
    rpm = rows // lora.bt.shape[0] if lora is not None and not per_row else 1
    bt_rows = min(tune["rows"], row_block(rpm)) if lora is not None else 16
    if per_row:  # any rows: a tile takes one pass per member among its rows
        bt_rows = TILE_ROWS if has_tiles else tune["rows"]
    return rpm, bt_rows


def _member(lora: LoraOperand | None, like: Tensor) -> tuple[Tensor, bool, Tensor, bool]:
    """Each row's member ids (continuous batching) and whether there are any; the tiles' one
    member (``TILE_ROWS``-row tiles) and whether they are known."""
    if lora is None or lora.member is None:
        return like, False, like, False
    if lora.tiles is None:
        return lora.member, True, like, False
    return lora.member, True, lora.tiles, True


@triton.jit
def _first_member(mv, r_ok):
    """The smallest member id among a tile's rows (2**40 where none)."""
    return tl.min(tl.where(r_ok, mv, 1 << 40), 0)


@triton.jit
def _next_member(mv, r_ok, m):
    """The smallest member id above ``m`` among a tile's rows (2**40 where none)."""
    return tl.min(tl.where(r_ok & (mv > m), mv, 1 << 40), 0)


@triton.jit
def _silu_lora(gate, up, u_ptr, b_ptr, rows, r_ok, cols, c_ok, m, su, su_m, sb_m, sb_c, inter,
               off_g, off_u, R: tl.constexpr, DOT: tl.constexpr, C: tl.constexpr,
               PRECISION: tl.constexpr):  # fmt: skip
    """``gate += u_g Bt_g``, ``up += u_u Bt_u`` of member ``m`` for the tile's rows ``r_ok``
    (the others add nothing): two tl.dot, or r rank-1 FMA updates."""
    if DOT:
        offs_c = tl.arange(0, C)
        u_at = u_ptr + rows[:, None] * su + m * su_m + offs_c[None, :]
        u_ok = r_ok[:, None] & (offs_c[None, :] < R)
        b_at = b_ptr + m * sb_m + offs_c[:, None] * sb_c + cols[None, :]
        b_ok = (offs_c[:, None] < R) & c_ok[None, :]
        b_g = tl.load(b_at, mask=b_ok, other=0.0)
        b_u = tl.load(b_at + inter, mask=b_ok, other=0.0)
        u_g = tl.load(u_at + off_g, mask=u_ok, other=0.0).to(b_g.dtype)
        u_u = tl.load(u_at + off_u, mask=u_ok, other=0.0).to(b_g.dtype)
        gate += tl.dot(u_g, b_g, input_precision=PRECISION)
        up += tl.dot(u_u, b_u, input_precision=PRECISION)
    else:
        u_row = u_ptr + rows * su + m * su_m
        b_col = b_ptr + m * sb_m + cols
        for c in tl.static_range(R):
            u_g = tl.load(u_row + off_g + c, mask=r_ok, other=0.0).to(tl.float32)
            u_u = tl.load(u_row + off_u + c, mask=r_ok, other=0.0).to(tl.float32)
            b_g = tl.load(b_col + c * sb_c, mask=c_ok, other=0.0).to(tl.float32)
            b_u = tl.load(b_col + c * sb_c + inter, mask=c_ok, other=0.0).to(tl.float32)
            gate += u_g[:, None] * b_g[None, :]
            up += u_u[:, None] * b_u[None, :]
    return gate, up


@triton.jit
def _silu_members(gate, up, u_ptr, b_ptr, mem_ptr, rows, r_ok, cols, c_ok, su, su_m, sb_m, sb_c,
                  inter, off_g, off_u, R: tl.constexpr, DOT: tl.constexpr, C: tl.constexpr,
                  PRECISION: tl.constexpr):  # fmt: skip
    """:func:`_silu_lora` for rows naming their members: one pass per member among the tile's
    rows, each adding to that member's rows only."""
    mv = tl.load(mem_ptr + rows, mask=r_ok, other=0).to(tl.int64)
    m = _first_member(mv, r_ok)
    while m < (1 << 40):
        gate, up = _silu_lora(
            gate, up, u_ptr, b_ptr, rows, r_ok & (mv == m), cols, c_ok, m, su, su_m, sb_m, sb_c,
            inter, off_g, off_u, R, DOT, C, PRECISION,
        )  # fmt: skip
        m = _next_member(mv, r_ok, m)
    return gate, up


@triton.jit
def _silu_mul_kernel(
    x_ptr, u_ptr, b_ptr, out_ptr, mem_ptr, tile_ptr, n_rows, inter, sx, su, su_m, sb_m, sb_c,
    so, rpm, off_g, off_u,
    HAS_LORA: tl.constexpr, R: tl.constexpr, BT: tl.constexpr, BLOCK: tl.constexpr,
    DOT: tl.constexpr, C: tl.constexpr, PRECISION: tl.constexpr, MEMBER: tl.constexpr,
    TILES: tl.constexpr,
):  # fmt: skip
    tb, blk = tl.program_id(0), tl.program_id(1)
    rows = tb * BT + tl.arange(0, BT)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    r_ok, c_ok = rows < n_rows, cols < inter
    ok = r_ok[:, None] & c_ok[None, :]
    at = x_ptr + rows[:, None] * sx + cols[None, :]
    gate = tl.load(at, mask=ok).to(tl.float32)
    up = tl.load(at + inter, mask=ok).to(tl.float32)
    if HAS_LORA and MEMBER:  # rows name their members
        one = -1
        if TILES:  # the tile's one member, if it has one (found once per step)
            one = tl.load(tile_ptr + tb).to(tl.int64)
        if one >= 0:  # a tile of one member: batches are sorted by member
            gate, up = _silu_lora(
                gate, up, u_ptr, b_ptr, rows, r_ok, cols, c_ok, one, su, su_m, sb_m, sb_c,
                inter, off_g, off_u, R, DOT, C, PRECISION,
            )  # fmt: skip
        else:
            gate, up = _silu_members(
                gate, up, u_ptr, b_ptr, mem_ptr, rows, r_ok, cols, c_ok, su, su_m, sb_m, sb_c,
                inter, off_g, off_u, R, DOT, C, PRECISION,
            )  # fmt: skip
    elif HAS_LORA:  # member-major rows: the tile's rows are one member's
        m = (tb * BT) // rpm
        gate, up = _silu_lora(
            gate, up, u_ptr, b_ptr, rows, r_ok, cols, c_ok, m, su, su_m, sb_m, sb_c, inter,
            off_g, off_u, R, DOT, C, PRECISION,
        )  # fmt: skip
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(
        out_ptr + rows[:, None] * so + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=ok
    )


@triton.jit
def _silu_tiles_kernel(
    x_ptr, u_ptr, b_ptr, out_ptr, mem_ptr, tile_ptr, n_rows, inter, sx, su, su_m, sb_m, sb_c,
    so, off_g, off_u, per_prog,
    R: tl.constexpr, BT: tl.constexpr, BLOCK: tl.constexpr, C: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """:func:`_silu_mul_kernel` for rows naming their members with known tiles, each program
    looping over ``per_prog`` column blocks of one row tile: the tile's member and its ``u``
    are read once, and the loop's loads pipeline."""
    tb, split = tl.program_id(0), tl.program_id(1)
    rows = tb * BT + tl.arange(0, BT)
    r_ok = rows < n_rows
    one = tl.load(tile_ptr + tb).to(tl.int64)
    offs_c = tl.arange(0, C)
    m = tl.maximum(one, 0)
    u_at = u_ptr + rows[:, None] * su + m * su_m + offs_c[None, :]
    u_ok = r_ok[:, None] & (offs_c[None, :] < R)  # (unused where the tile has no one member)
    u_g = tl.load(u_at + off_g, mask=u_ok, other=0.0).to(b_ptr.dtype.element_ty)
    u_u = tl.load(u_at + off_u, mask=u_ok, other=0.0).to(b_ptr.dtype.element_ty)
    b_row = b_ptr + m * sb_m + offs_c[:, None] * sb_c
    first = split * per_prog * BLOCK
    for start in range(first, tl.minimum(first + per_prog * BLOCK, inter), BLOCK):
        cols = start + tl.arange(0, BLOCK)
        c_ok = cols < inter
        ok = r_ok[:, None] & c_ok[None, :]
        at = x_ptr + rows[:, None] * sx + cols[None, :]
        gate = tl.load(at, mask=ok).to(tl.float32)
        up = tl.load(at + inter, mask=ok).to(tl.float32)
        if one >= 0:  # a tile of one member (batches are sorted by member)
            b_ok = (offs_c[:, None] < R) & c_ok[None, :]
            b_g = tl.load(b_row + cols[None, :], mask=b_ok, other=0.0)
            b_u = tl.load(b_row + cols[None, :] + inter, mask=b_ok, other=0.0)
            gate += tl.dot(u_g, b_g, input_precision=PRECISION)
            up += tl.dot(u_u, b_u, input_precision=PRECISION)
        else:
            gate, up = _silu_members(
                gate, up, u_ptr, b_ptr, mem_ptr, rows, r_ok, cols, c_ok, su, su_m, sb_m, sb_c,
                inter, off_g, off_u, R, True, C, PRECISION,
            )  # fmt: skip
        out = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(
            out_ptr + rows[:, None] * so + cols[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=ok,
        )


def silu_mul(gate_up: Tensor, lora: LoraOperand | None = None) -> Tensor:
    """``silu(gate) * up`` for ``gate_up [T, 2 * inter]`` (rows may be strided); ``[T, inter]``.

    With ``lora`` each row's LoRA delta ``u_j Bt_j`` is added to gate and up first, in the
    same pass."""
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, inter, dtype=gate_up.dtype, device=gate_up.device)
    has = lora is not None
    mem, per_row, tiles, has_tiles = _member(lora, gate_up)
    tune = TUNE["silu"]
    rpm, bt_rows = _tiling(lora, rows, per_row, has_tiles, tune)
    elems = tune["few_elems"] if rows <= tune["few"] else tune["elems"]
    block = elems // bt_rows if lora is not None else 8192 // bt_rows
    up_, bt, su, su_m, sb_m, sb_c, rank, offs = _lora_args(lora, gate_up)
    dot = bool(tune["dot"]) and bt_rows >= 16
    loop = tune["loop"] if rows > tune["loop_rows"] else 0
    if has_tiles and loop and dot:  # a row tile's program loops over column blocks
        n_blocks = triton.cdiv(inter, block)
        per_prog = min(loop, n_blocks)
        _silu_tiles_kernel[(triton.cdiv(rows, bt_rows), triton.cdiv(n_blocks, per_prog))](
            gate_up, up_, bt, out, mem, tiles, rows, inter,
            gate_up.stride(0), su, su_m, sb_m, sb_c, out.stride(0), offs[0], offs[1], per_prog,
            R=rank, BT=bt_rows, BLOCK=block, C=_dot_cols(rank), PRECISION=_precision(gate_up),
            num_warps=tune["warps"], num_stages=tune["stages"],
        )  # fmt: skip
        return out
    _silu_mul_kernel[(triton.cdiv(rows, bt_rows), triton.cdiv(inter, block))](
        gate_up, up_, bt, out, mem, tiles, rows, inter,
        gate_up.stride(0), su, su_m, sb_m, sb_c, out.stride(0), rpm, offs[0], offs[1],
        HAS_LORA=has, R=rank, BT=bt_rows, BLOCK=block, DOT=dot, C=_dot_cols(rank),
        PRECISION=_precision(gate_up), MEMBER=per_row, TILES=has_tiles,
        num_warps=tune["warps"] if has else 8,
    )  # fmt: skip
    return out


@triton.jit
def _rope_fma(x1, x2, u_ptr, b_ptr, rows, r_ok, m, off, h, offs_d, su, su_m, sb_m, sb_c,
              R: tl.constexpr, HALF: tl.constexpr):  # fmt: skip
    """``+ u_j Bt_j`` of member ``m`` on head ``h``'s two halves for the tile's rows ``r_ok``
    (the others add nothing), as rank-1 updates."""
    u_row = u_ptr + rows * su + m * su_m + off
    b_col = b_ptr + m * sb_m + h * 2 * HALF + offs_d
    for c in tl.static_range(R):
        u = tl.load(u_row + c, mask=r_ok, other=0.0).to(tl.float32)[:, None]
        x1 += u * tl.load(b_col + c * sb_c).to(tl.float32)[None, :]
        x2 += u * tl.load(b_col + c * sb_c + HALF).to(tl.float32)[None, :]
    return x1, x2


@triton.jit
def _qkv_rope_kernel(
    x_ptr, cos_ptr, sin_ptr, u_ptr, b_ptr, out_ptr, kc_ptr, vc_ptr, slot_ptr, mem_ptr,
    tile_ptr, crow_ptr, cpos_ptr,
    n_rows, q_heads, rot_heads, sx_t, sx_h, sc_t, su, su_m, sb_m, sb_c, so_t, so_h,
    skc_r, skc_h, skc_n, svc_r, svc_h, svc_n, rpm, off_q, off_k, off_v,
    HAS_LORA: tl.constexpr, R: tl.constexpr, BT: tl.constexpr, HALF: tl.constexpr,
    TO_CACHE: tl.constexpr, DOT: tl.constexpr, C: tl.constexpr, PRECISION: tl.constexpr,
    MEMBER: tl.constexpr, PER_ROW: tl.constexpr, TILES: tl.constexpr,
):  # fmt: skip
    tb, h = tl.program_id(0), tl.program_id(1)
    rows = tb * BT + tl.arange(0, BT)
    offs_d = tl.arange(0, HALF)
    ok = rows[:, None] < n_rows
    at = x_ptr + rows[:, None] * sx_t + h * sx_h + offs_d[None, :]
    x1 = tl.load(at, mask=ok).to(tl.float32)
    x2 = tl.load(at + HALF, mask=ok).to(tl.float32)
    if HAS_LORA and MEMBER:  # rows name their members
        r_ok = rows < n_rows
        off = tl.where(h < q_heads, off_q, tl.where(h < rot_heads, off_k, off_v))
        one = -1
        if TILES:  # the tile's one member, if it has one (found once per step)
            one = tl.load(tile_ptr + tb).to(tl.int64)
        if one >= 0:  # a tile of one member: batches are sorted by member
            x1, x2 = _rope_fma(x1, x2, u_ptr, b_ptr, rows, r_ok, one, off, h, offs_d, su, su_m,
                               sb_m, sb_c, R, HALF)  # fmt: skip
        else:  # one pass per member among the tile's rows
            mv = tl.load(mem_ptr + rows, mask=r_ok, other=0).to(tl.int64)
            m = _first_member(mv, r_ok)
            while m < (1 << 40):
                x1, x2 = _rope_fma(x1, x2, u_ptr, b_ptr, rows, r_ok & (mv == m), m, off, h,
                                   offs_d, su, su_m, sb_m, sb_c, R, HALF)  # fmt: skip
                m = _next_member(mv, r_ok, m)
    elif HAS_LORA and DOT:  # + u_j Bt_j on this head's columns (j: its module, q, k or v)
        m = (tb * BT) // rpm
        off = tl.where(h < q_heads, off_q, tl.where(h < rot_heads, off_k, off_v))
        offs_c = tl.arange(0, C)
        c_ok = offs_c < R
        u_at = u_ptr + rows[:, None] * su + m * su_m + off + offs_c[None, :]
        b_at = b_ptr + m * sb_m + offs_c[:, None] * sb_c + h * 2 * HALF + offs_d[None, :]
        b1 = tl.load(b_at, mask=c_ok[:, None], other=0.0)
        b2 = tl.load(b_at + HALF, mask=c_ok[:, None], other=0.0)
        u = tl.load(u_at, mask=ok & c_ok[None, :], other=0.0).to(b1.dtype)
        x1 += tl.dot(u, b1, input_precision=PRECISION)
        x2 += tl.dot(u, b2, input_precision=PRECISION)
    elif HAS_LORA:  # the same as rank-1 updates
        m = (tb * BT) // rpm
        off = tl.where(h < q_heads, off_q, tl.where(h < rot_heads, off_k, off_v))
        x1, x2 = _rope_fma(x1, x2, u_ptr, b_ptr, rows, rows < n_rows, m, off, h, offs_d, su,
                           su_m, sb_m, sb_c, R, HALF)  # fmt: skip
    c_at = rows[:, None] * sc_t + offs_d[None, :]
    c1, c2 = tl.load(cos_ptr + c_at, mask=ok), tl.load(cos_ptr + c_at + HALF, mask=ok)
    s1, s2 = tl.load(sin_ptr + c_at, mask=ok), tl.load(sin_ptr + c_at + HALF, mask=ok)
    rot = h < rot_heads
    o1 = tl.where(rot, x1 * c1.to(tl.float32) - x2 * s1.to(tl.float32), x1)
    o2 = tl.where(rot, x2 * c2.to(tl.float32) + x1 * s2.to(tl.float32), x2)
    o_at = out_ptr + rows[:, None] * so_t + h * so_h + offs_d[None, :]
    ty = out_ptr.dtype.element_ty
    tl.store(o_at, o1.to(ty), mask=ok)
    tl.store(o_at + HALF, o2.to(ty), mask=ok)
    if TO_CACHE:  # decode: k and v heads also go straight into cache slot ``slot``
        hs = tl.full([BT, 1], h, tl.int32)  # the head as a tensor: masks stay [BT, 1]
        is_k, is_v = ok & (hs >= q_heads) & (hs < rot_heads), ok & (hs >= rot_heads)
        if PER_ROW:  # continuous batching: row i goes to cache row crow[i], position cpos[i]
            crow = tl.load(crow_ptr + rows, mask=rows < n_rows, other=0).to(tl.int64)[:, None]
            cpos = tl.load(cpos_ptr + rows, mask=rows < n_rows, other=0).to(tl.int64)[:, None]
            k_at = kc_ptr + crow * skc_r + (h - q_heads) * skc_h + cpos * skc_n
            v_at = vc_ptr + crow * svc_r + (h - rot_heads) * svc_h + cpos * svc_n
        else:
            slot = tl.load(slot_ptr)
            k_at = kc_ptr + rows[:, None] * skc_r + (h - q_heads) * skc_h + slot * skc_n
            v_at = vc_ptr + rows[:, None] * svc_r + (h - rot_heads) * svc_h + slot * svc_n
        k_at += offs_d[None, :]
        v_at += offs_d[None, :]
        cty = kc_ptr.dtype.element_ty  # the cache's dtype: the model's, or fp8 (rounded here)
        tl.store(k_at, o1.to(cty), mask=is_k)
        tl.store(k_at + HALF, o2.to(cty), mask=is_k)
        tl.store(v_at, o1.to(cty), mask=is_v)
        tl.store(v_at + HALF, o2.to(cty), mask=is_v)


def qkv_rope(
    qkv: Tensor,
    cos: Tensor,
    sin: Tensor,
    rot_heads: int,
    lora: LoraOperand | None = None,
    cache: tuple[Tensor, Tensor, Tensor] | None = None,
) -> Tensor:
    """``qkv [T, heads, hd]`` (last dim contiguous) with RoPE (``cos``/``sin`` one ``[hd]`` row
    per token) applied to the first ``rot_heads`` heads; a new contiguous ``[T, heads, hd]``.

    With ``lora`` each row's LoRA delta is added first. With
    ``cache = (k [T, kv_heads, S, hd], v, slot)`` (one token per row) the k heads (after the q
    heads, up to ``rot_heads``) and the v heads (the rest) are also written at ``slot``; with
    ``cache = (k [C, kv_heads, S, hd], v, rows [T], positions [T])`` (continuous batching) row
    ``i``'s at cache row ``rows[i]``, position ``positions[i]``."""
    n, heads, hd = qkv.shape
    ct, st = cos.reshape(-1, hd), sin.reshape(-1, hd)
    out = torch.empty(n, heads, hd, dtype=qkv.dtype, device=qkv.device)
    mem, per_row, tiles, has_tiles = _member(lora, qkv)
    tune = TUNE["rope"]
    rpm, bt_rows = _tiling(lora, n, per_row, has_tiles, tune)
    crow = cpos = out
    if cache is not None and len(cache) == 4:
        kc, vc, crow, cpos = cache
        slot = out
    else:
        kc, vc, slot = cache if cache is not None else (out[:, :, None], out[:, :, None], out)
    q_heads = rot_heads - (heads - rot_heads)  # as many k heads as v heads
    up_, bt, su, su_m, sb_m, sb_c, rank, offs = _lora_args(lora, qkv)
    _qkv_rope_kernel[(triton.cdiv(n, bt_rows), heads)](
        qkv, ct, st, up_, bt, out, kc, vc, slot, mem, tiles, crow, cpos,
        n, q_heads, rot_heads, qkv.stride(0), qkv.stride(1), ct.stride(0),
        su, su_m, sb_m, sb_c, out.stride(0), out.stride(1),
        kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2),
        rpm, offs[0], offs[1], offs[2],
        HAS_LORA=lora is not None, R=rank, BT=bt_rows, HALF=hd // 2, TO_CACHE=cache is not None,
        DOT=bool(tune["dot"]) and bt_rows >= 16 and not per_row, C=_dot_cols(rank),
        PRECISION=_precision(qkv), MEMBER=per_row, PER_ROW=cache is not None and len(cache) == 4,
        TILES=has_tiles,
        num_warps=tune["warps"] if lora is not None else 4,
    )  # fmt: skip
    return out


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, y_ptr, u_ptr, b_ptr, w_ptr, h_ptr, mem_ptr, hidden,
    sx, sy, su, su_m, sb_m, sb_c, sh, rpm, eps,
    HAS_Y: tl.constexpr, HAS_LORA: tl.constexpr, R: tl.constexpr, BLOCK: tl.constexpr,
    MEMBER: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < hidden
    ty = x_ptr.dtype.element_ty
    x_at = x_ptr + row * sx + cols
    x = tl.load(x_at, mask=ok, other=0.0).to(tl.float32)
    if HAS_Y:
        x += tl.load(y_ptr + row * sy + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_LORA:  # + u_m Bt_m, the row's member m
        if MEMBER:  # noqa: SIM108 (a constexpr branch: Triton compiles only one side)
            m = tl.load(mem_ptr + row).to(tl.int64)
        else:
            m = row // rpm
        for c in tl.static_range(R):
            u = tl.load(u_ptr + row * su + m * su_m + c).to(tl.float32)
            bt = tl.load(b_ptr + m * sb_m + c * sb_c + cols, mask=ok, other=0.0)
            x += u * bt.to(tl.float32)
    if HAS_Y or HAS_LORA:  # the residual stream, rounded as HF rounds it
        x = x.to(ty).to(tl.float32)
        tl.store(x_at, x.to(ty), mask=ok)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / hidden + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    h = (x * rstd).to(ty).to(tl.float32) * w  # rounded like HF's RMSNorm
    tl.store(h_ptr + row * sh + cols, h.to(ty), mask=ok)


NORM_MAX_HIDDEN = 16384  # add_rms_norm holds a row in registers


def add_rms_norm(
    x: Tensor,
    weight: Tensor,
    eps: float,
    y: Tensor | None = None,
    lora: LoraOperand | None = None,
) -> Tensor:
    """``x += y + u_m Bt_m`` in place (each present), then ``rmsnorm(x) * weight``: one kernel,
    one program per row (``hidden <= NORM_MAX_HIDDEN``).

    ``x [T, hidden]`` contiguous rows; ``y [T, hidden]`` may be a strided view (a GEMM's output
    columns); ``lora``: the pending LoRA (a single module's)."""
    rows, hidden = x.shape
    h = torch.empty_like(x)
    mem, per_row, _, _ = _member(lora, x)  # one row per program: Bt rows per row, from L2
    rpm = rows // lora.bt.shape[0] if lora is not None and not per_row else 1
    up_, bt, su, su_m, sb_m, sb_c, rank, _ = _lora_args(lora, x)
    yy = x if y is None else y
    block = triton.next_power_of_2(hidden)
    _add_rms_norm_kernel[(rows,)](
        x, yy, up_, bt, weight, h, mem, hidden,
        x.stride(0), yy.stride(0), su, su_m, sb_m, sb_c, h.stride(0), rpm, eps,
        HAS_Y=y is not None, HAS_LORA=lora is not None, R=rank, BLOCK=block, MEMBER=per_row,
        num_warps=TUNE["norm"]["warps"] or max(1, min(16, block // 256)),
    )  # fmt: skip
    return h


def _dot_cols(rank: int) -> int:
    """``tl.dot``'s inner size for ``rank`` columns: a power of two >= 16 (masked beyond)."""
    return max(16, triton.next_power_of_2(rank))


def _precision(x: Tensor) -> str:
    return "ieee" if x.dtype == torch.float32 else "tf32"
