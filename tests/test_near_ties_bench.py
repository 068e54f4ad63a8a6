"""``python -m benchmarks.near_ties`` (issue 37's check of where two runs' answers part) on the
tiny model: two saved "runs" whose answers are the model's own greedy text, one row changed
to the reference's second choice at a known token, are found to part there, at that gap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.near_ties import compare, first_difference, load_reference, main

PROMPTS = ["Using the numbers 3 5 7", "Count to ten: one two", "The answer is"]
STEPS, CHANGED = 8, 3  # tokens a completion has; the row-1 token run B changes


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def greedy(model: torch.nn.Module, tok: object, prompt: str) -> tuple[list[int], torch.Tensor]:
    """``STEPS`` greedy tokens after ``prompt`` and their logits ``[STEPS, vocab]``."""
    ids = list(tok(prompt)["input_ids"])  # type: ignore[operator]
    out, logits = [], []
    with torch.inference_mode():
        for _ in range(STEPS):
            last = model(input_ids=torch.tensor([ids + out])).logits[0, -1].float()
            logits.append(last)
            out.append(int(last.argmax()))
    return out, torch.stack(logits)


def save_run(root: Path, rows: list[tuple[str, str]]) -> Path:
    """A run directory whose test set's and one extra set's answers at generation 0 are
    ``rows`` (prompt, completion)."""
    for d in (root / "samples", root / "samples" / "held"):
        d.mkdir(parents=True)
        lines = [json.dumps({"prompt": p, "completion": c}) for p, c in rows]
        (d / "gen-000.jsonl").write_text("\n".join(lines) + "\n")
    return root


def test_a_changed_token_is_found_at_its_gap(tiny_model_dir: str, tmp_path: Path) -> None:
    model, tok = load_reference(tiny_model_dir, None, torch.float32)
    rows_a, rows_b, expect = [], [], None
    for i, prompt in enumerate(PROMPTS):
        ids, logits = greedy(model, tok, prompt)
        text = tok.decode(ids)
        if tok(text, add_special_tokens=False)["input_ids"] != ids:
            pytest.skip("the tiny tokenizer does not give these ids back")
        rows_a.append((prompt, text))
        if i != 1:
            rows_b.append((prompt, text))
            continue
        top2 = logits[CHANGED].topk(2)
        other = [*ids[:CHANGED], int(top2.indices[1])]
        changed = tok.decode(other)
        if tok(changed, add_special_tokens=False)["input_ids"] != other:
            pytest.skip("the second choice does not tokenize back")
        rows_b.append((prompt, changed))
        expect = float(top2.values[0] - top2.values[1])
    a, b = save_run(tmp_path / "a", rows_a), save_run(tmp_path / "b", rows_b)
    counts, found = compare(a, b, model, tok)
    assert counts == {"": (2, 3), "held": (2, 3)}
    assert [(f.set, f.row, f.token, f.rank_a, f.rank_b) for f in found] == [
        ("", 1, CHANGED, 0, 1),
        ("held", 1, CHANGED, 0, 1),
    ]
    f = found[0]
    assert f.gap_a == pytest.approx(0.0, abs=1e-5)
    assert f.gap_b == pytest.approx(expect, rel=1e-4, abs=1e-5)
    assert f.prefix_agrees == 1.0  # the shared tokens are the reference's own greedy ones
    out = tmp_path / "ties.json"
    assert main([str(a), str(b), tiny_model_dir, "-", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["counts"][""] == [2, 3] and len(saved["partings"]) == 2
