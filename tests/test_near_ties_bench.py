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


def save_run(root: Path, rows: list[tuple[str, str]], name: str = "gen-000.jsonl") -> Path:
    """A run directory whose test set's and one extra set's answers at generation 0 are
    ``rows`` (prompt, completion), in files named ``name``."""
    for d in (root / "samples", root / "samples" / "held"):
        d.mkdir(parents=True)
        lines = [json.dumps({"prompt": p, "completion": c}) for p, c in rows]
        (d / name).write_text("\n".join(lines) + "\n")
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
        if i == 2:  # run B's answer ends early: the reference's best EOS is scored there
            rows_b.append((prompt, tok.decode(ids[:CHANGED])))
            continue
        if i != 1:
            rows_b.append((prompt, text))
            continue
        top2 = logits[CHANGED].topk(2)
        other = [*ids[:CHANGED], int(top2.indices[1])]
        changed = tok.decode(other)
        if tok(changed, add_special_tokens=False)["input_ids"] != other:
            pytest.skip("the second choice does not tokenize back")
        rows_b.append((prompt, changed))
        pair = float(top2.values[0] - top2.values[1])
        shared = logits[:CHANGED].topk(2).values
        expect = (pair, 100.0 * float(((shared[:, 0] - shared[:, 1]) < pair).float().mean()))
    # the runs' files padded to other widths (gen-000: 100+ generations; gen-0: one)
    a = save_run(tmp_path / "a", rows_a)
    b = save_run(tmp_path / "b", rows_b, name="gen-0.jsonl")
    counts, found, unscored = compare(a, b, model, tok)
    assert counts == {"": (1, 3), "held": (1, 3)} and unscored == []
    assert [(f.set, f.row, f.token, f.rank_a, f.rank_b) for f in found[:2]] == [
        ("", 1, CHANGED, 0, 1),
        ("", 2, CHANGED, 0, found[1].rank_b),
    ]
    changed_row, ended_row = found[0], found[1]
    assert changed_row.gap_a == pytest.approx(0.0, abs=1e-5)
    assert changed_row.gap_b == pytest.approx(expect[0], rel=1e-4, abs=1e-5)
    assert changed_row.margin_pct == pytest.approx(expect[1])
    assert changed_row.prefix_agrees == 1.0  # the shared tokens are the reference's own greedy
    assert not changed_row.ended_b and ended_row.ended_b and ended_row.b == ""
    assert ended_row.gap_b > 0  # an EOS was not the tiny model's greedy choice there
    out = tmp_path / "ties.json"
    assert main([str(a), str(b), tiny_model_dir, "-", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["counts"][""] == [1, 3] and len(saved["partings"]) == 4
    assert saved["gen"] == 0 and saved["adapter"] == "-" and saved["unscored"] == []


def test_saved_token_ids_are_compared_as_they_are(tiny_model_dir: str, tmp_path: Path) -> None:
    """Rows that carry the engine's ``token_ids`` are compared by those, not tokenized again:
    here texts that cannot tokenize back (so would be unscored) part where their ids do."""
    model, tok = load_reference(tiny_model_dir, None, torch.float32)
    ids, logits = greedy(model, tok, PROMPTS[0])
    other = [*ids[:CHANGED], int(logits[CHANGED].topk(2).indices[1])]
    for name, toks in (("a", ids), ("b", other)):
        d = tmp_path / name / "samples"
        d.mkdir(parents=True)
        line = {"prompt": PROMPTS[0], "completion": f"<{name}: not the ids' text>"}
        (d / "gen-0.jsonl").write_text(json.dumps(line | {"token_ids": toks}) + "\n")
    counts, found, unscored = compare(tmp_path / "a", tmp_path / "b", model, tok)
    assert counts == {"": (0, 1)} and unscored == []
    assert [(f.token, f.rank_a, f.rank_b, f.ended_b) for f in found] == [(CHANGED, 0, 1, False)]


def test_missing_samples_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="samples"):
        compare(tmp_path / "a", tmp_path / "b", None, None)
