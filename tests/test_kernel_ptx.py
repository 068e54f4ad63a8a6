"""The slot-attention kernel compiled for an H100 (sm_90) on the CPU: what the GPU will run.

Speculation's verify rows are exact only if each row's attention is bit-equal to the plain
step's one-row program. On an H100 a kernel that put a run's ``(k + 1) x g`` queries in one
64-row tile changed 17 of 2,000 greedy answers (docs/benchmarks.md, session 24): that tile
compiles to ``wgmma``, a one-row program's 16-row tile to ``mma.sync``. Here Triton compiles
both programs to PTX (no GPU needed) and compares their floating-point instructions in order.
"""

from __future__ import annotations

import re

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from evolm.engine.kernels import attention  # noqa: E402

FLOAT_OP = re.compile(r"f32|f16|bf16|e4m3|mma|shfl|ex2|rcp|div")


def float_ops(g: int, hd: int, span: int, fp8: bool, chunk: int, m_pad: int) -> list[str]:
    """The floating-point PTX instructions, in order, of a slot-attention program taking
    ``chunk`` rows of runs of ``span`` in an ``m_pad``-row tile (``g`` query heads a KV head,
    head dim ``hd``, a bf16 or fp8 cache), compiled for sm_90 with the engine's tuning."""
    kv = "*fp8e4nv" if fp8 else "*bf16"
    types = ["*bf16", kv, kv, "*i64", "*i64", "*i64", "*bf16", *["i64"] * 12, "i32", "fp32"]
    tune = attention.SLOT_TUNE_FP8 if fp8 else attention.SLOT_TUNE
    consts = {
        "G": g,
        "SPAN": span,
        "CHUNK": chunk,
        "M_PAD": m_pad,
        "HD": hd,
        "BLOCK_N": tune["block_n"],
        "PRECISION": "tf32",
        "FP8": fp8,
    }
    names = attention._slot_attention_kernel.arg_names
    signature = dict(zip(names, [*types, *["constexpr"] * len(consts)], strict=True))
    source = ASTSource(
        fn=attention._slot_attention_kernel,
        signature=signature,
        constexprs={(names.index(k),): v for k, v in consts.items()},
    )
    options = {"num_warps": tune["warps"], "num_stages": tune["stages"]}
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
    ops = re.findall(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.]*)", ptx, re.M)
    return [op for op in ops if FLOAT_OP.search(op)]


@pytest.mark.parametrize(
    ("g", "hd", "fp8"), [(7, 64, False), (6, 128, False), (3, 64, False), (7, 64, True)]
)
def test_verify_programs_run_the_one_row_programs_float_instructions(
    g: int, hd: int, fp8: bool
) -> None:
    """Qwen2.5-0.5B (7 query heads a KV head, head dim 64), 1.5B (6, 128) and SmolLM2 (3, 64)
    shapes, bf16 and fp8 caches: a program of a run's rows (``slot_attention(span=...)``, as
    many rows as one row's tile holds) runs the one-row program's floating-point instructions
    in the same order; only its integer index math differs. A whole run of 5 rows in one tile,
    the first version, runs others (``wgmma``) at ``g`` = 7, which are the one-row program's
    only where its tile is as high (``SLOT_TUNE["tile"]`` = 64)."""
    tile, chunk = attention.query_tile(g), attention.verify_chunk(g)
    one = float_ops(g, hd, 1, fp8, 1, tile)
    assert any("mma" in op for op in one)
    for span in (2, 5):
        assert float_ops(g, hd, span, fp8, min(span, chunk), tile) == one, span
    if g == 7 and not fp8:
        whole = float_ops(g, hd, 5, fp8, 5, triton.next_power_of_2(5 * g))
        assert whole != one and any("wgmma" in op for op in whole)
        # a 64-row tile for every program (SLOT_TUNE["tile"] = 64): a run in one program,
        # the plain rows' programs in the same tile, the same instructions again
        assert float_ops(g, hd, 1, fp8, 1, 64) == whole
