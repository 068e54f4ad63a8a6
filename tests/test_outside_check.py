"""The outside check of the paper-split results (docs/results/countdown-paper-split/check_chat.py:
plain transformers + peft, no evolm code) must ask the model what evolm's countdown task asked
it: the same chat messages, worked examples included, also when the examples depend on the
puzzle's count of numbers (``task.shots={3:2,4:3}``)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from evolm.task.countdown import Countdown

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs/results/countdown-paper-split"
PAPER_FILE = REPO.parent / "shared/data/countdown/countdown.json"

pytestmark = pytest.mark.skipif(
    not PAPER_FILE.is_file(), reason="the paper's countdown.json is not here"
)


def _check_chat() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_chat", PAGE / "check_chat.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
