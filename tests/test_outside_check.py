"""The outside check of the paper-split results (docs/results/countdown-paper-split/check_chat.py:
plain transformers + peft, no evolm code) must ask the model what evolm's countdown task asked
it: the same chat messages, worked examples included, also when the examples depend on the
puzzle's count of numbers (``task.shots={3:2,4:3}``)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoConfig

from evolm.lora import LoraLayout, LoraSpec, save_adapter
from evolm.task.countdown import Countdown

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs/results/countdown-paper-split"
PAPER_FILE = REPO.parent / "shared/data/countdown/countdown.json"

pytestmark = pytest.mark.skipif(
    not PAPER_FILE.is_file(), reason="the paper's countdown.json is not here"
)


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, PAGE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_chat() -> ModuleType:
    return _load("check_chat")


def _run_check_chat(args: list[str], env: dict[str, str]) -> dict:
    """check_chat.py as a user runs it (``args``: MODEL_DIR ADAPTER_DIR OUT.json ...), with
    ``env`` added to this environment; the result it wrote."""
    done = subprocess.run(
        [sys.executable, str(PAGE / "check_chat.py"), *args],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(Path(args[2]).read_text())


def _records() -> list[dict]:
    return json.loads(PAPER_FILE.read_text())


@pytest.mark.parametrize(
    ("shots", "shots_file"),
    [(2, "session-12/shots.json"), ({3: 2, 4: 3}, "session-25/shots-by-count.json")],
)
def test_the_outside_check_sends_evolms_messages(shots: int | dict, shots_file: str) -> None:
    check = _check_chat()
    committed = json.loads((PAGE / shots_file).read_text())
    task = Countdown(data_file=str(PAPER_FILE), chat_template=True, shots=shots)
    records = _records()
    by_numbers = {(tuple(r["numbers"]), str(r["target"])): r for r in records}
    seen = set()
    for example in [*task.train, *task.eval]:
        ref = example.reference
        record = by_numbers[(tuple(ref["numbers"]), str(ref["target"]))]
        assert check.messages(record, committed) == example.prompt
        seen.add(len(ref["numbers"]))
    assert seen == {3, 4}


def test_examples_by_count_differ_by_count() -> None:
    """The per-count file gives a 4-number puzzle other examples than a 3-number one (a check
    that sent one list to all would pass the equality above only if evolm did the same)."""
    check = _check_chat()
    shots = json.loads((PAGE / "session-25/shots-by-count.json").read_text())
    records = _records()
    three = next(r for r in records if len(r["numbers"]) == 3)
    four = next(r for r in records if len(r["numbers"]) == 4)
    assert check.messages(three, shots)[1:-1] != check.messages(four, shots)[1:-1]
    assert len(check.messages(four, shots)) == len(check.messages(three, shots)) + 2


def test_heldout_sets_are_the_experiments_extra_evals() -> None:
    """heldout_sets.py writes the puzzles the runs evaluated as tree_free and uniform_free: its
    fields equal the experiment's, and its records are the puzzles a task built from them holds."""
    sets = _load("heldout_sets")
    conf = OmegaConf.load(REPO / "conf/experiment/qwen05_paper_countdown.yaml").extra_evals
    for name in sets.SETS:
        held = conf[name]
        assert {k: held[k] for k in sets.HELD} == sets.HELD
        assert held.generator == name.removesuffix("_free")
        records = sets.records(name)
        task = Countdown(generator=held.generator, **sets.HELD)
        assert [(r["numbers"], r["target"]) for r in records] == [
            (list(e.reference["numbers"]), str(e.reference["target"])) for e in task.eval
        ]
        assert len(records) == 200 and {len(r["numbers"]) for r in records} == {3, 4}


def test_the_outside_check_sends_evolms_messages_on_the_heldout_sets() -> None:
    """With examples by count, check_chat.py asks each of evolm's held-out puzzles what the
    run's extra eval asked it."""
    check, sets = _check_chat(), _load("heldout_sets")
    committed = json.loads((PAGE / "session-25/shots-by-count.json").read_text())
    for name in sets.SETS:
        task = Countdown(
            generator=name.removesuffix("_free"), chat_template=True, shots={3: 2, 4: 3},
            **sets.HELD,
        )  # fmt: skip
        for record, example in zip(sets.records(name), task.eval, strict=True):
            assert check.messages(record, committed) == example.prompt


def test_the_outside_check_runs_on_other_puzzles(tmp_path: Path, tiny_model_dir: str) -> None:
    """check_chat.py end to end on the CPU with PUZZLES_JSON: a real PEFT adapter on the tiny
    model, two of evolm's held-out puzzles, each answer scored and named with its puzzle."""
    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), LoraSpec())
    gen = torch.Generator().manual_seed(0)
    tensors = [torch.randn(shape, generator=gen) * 0.1 for shape in layout.shapes()]
    save_adapter(tmp_path / "adapter", layout, tensors, base_model=tiny_model_dir)
    puzzles = _load("heldout_sets").records("uniform_free")[:3]
    (tmp_path / "puzzles.json").write_text(json.dumps(puzzles))
    env = {"PUZZLES_JSON": str(tmp_path / "puzzles.json"), "FIRST": "1"}
    args = [tiny_model_dir, str(tmp_path / "adapter"), str(tmp_path / "check.json"), "2", "8", "2"]
    result = _run_check_chat(args, env)
    assert (result["first"], result["puzzles"], result["max_new_tokens"]) == (1, 2, 8)
    answers = result["answers"]
    assert [(a["puzzle"], a["numbers"], a["target"]) for a in answers] == [
        (p["id"], p["numbers"], p["target"]) for p in puzzles[1:3]
    ]
    check = _check_chat()  # the outside scorer (../shared/tools/countdown_check.py)
    right = [check.reward(a["completion"], a["numbers"], a["target"])[2] > 0 for a in answers]
    assert [a["correct"] for a in answers] == right
    assert result["accuracy"] == sum(right) / 2
    assert sum(int(v.split("/")[1]) for v in result["by_family"].values()) == 2


def test_the_outside_check_asks_the_base_model_with_a_dash(
    tmp_path: Path, tiny_model_dir: str
) -> None:
    """ADAPTER_DIR ``-``: the base model alone, asked the same way. Its answers are those of an
    adapter whose every tensor is zero (a LoRA that adds nothing), and the record says ``-``."""
    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), LoraSpec())
    save_adapter(
        tmp_path / "zero", layout, [torch.zeros(s) for s in layout.shapes()],
        base_model=tiny_model_dir,
    )  # fmt: skip
    (tmp_path / "puzzles.json").write_text(
        json.dumps(_load("heldout_sets").records("tree_free")[:2])
    )
    env = {"PUZZLES_JSON": str(tmp_path / "puzzles.json")}
    base, zero = (
        _run_check_chat(
            [tiny_model_dir, adapter, str(tmp_path / f"{name}.json"), "2", "12", "2"], env
        )
        for name, adapter in (("base", "-"), ("zero", str(tmp_path / "zero")))
    )
    assert base["adapter"] == "-"
    assert [a["completion"] for a in base["answers"]] == [a["completion"] for a in zero["answers"]]
    assert all(a["completion"] for a in base["answers"])
