"""The paper's countdown.json is non-commercial: evolm reads it from ../shared/data and never
copies it. Committed records name its puzzles by id (docs/results/countdown-paper-split/
puzzles.py strips them); this fails when a file in the tree holds them again (a run's
``samples/`` committed as they came off the GPU)."""

from __future__ import annotations

import io
import json
import lzma
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAPER_FILE = ROOT.parent / "shared" / "data" / "countdown" / "countdown.json"
FORMS = (
    # the prompt's sentence (numpy-printed numbers)
    re.compile(r"Using the numbers \[([\d ]+)\], create an equation that equals (-?\d+(?:\.\d+)?)"),
    # JSON or Python fields, compact or indented: "numbers": [...], "target": "..."
    re.compile(
        r"""numbers['"]?\s*[:=]\s*\[([\d,\s]+)\]\s*,\s*['"]?target['"]?\s*[:=]\s*['"]?(-?\d+(?:\.\d+)?)"""
    ),
)
MOST = 5
"""A document may quote this many of the paper's puzzles (an example in prose), no more."""
SKIP = {".git", ".venv", "outputs", "wheelhouse", ".carry", "node_modules", "__pycache__"}


def documents(path: Path) -> Iterator[tuple[str, str]]:
    """``(name, text)`` of ``path``, decompressed and unpacked (.xz, .tar.xz); nothing for a
    binary file."""
    data = path.read_bytes()
    if path.name.endswith(".tar.xz"):
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
            for member in tar.getmembers():
                if member.isfile():
                    body = tar.extractfile(member).read()  # type: ignore[union-attr]
                    yield f"{path}:{member.name}", body.decode(errors="replace")
        return
    if path.suffix == ".xz":
        data = lzma.decompress(data)
    if b"\0" not in data[:4096]:
        yield str(path), data.decode(errors="replace")


@pytest.mark.skipif(not PAPER_FILE.is_file(), reason="../shared/data/countdown is not beside")
def test_no_file_in_the_tree_holds_the_papers_puzzles() -> None:
    paper = {(tuple(r["numbers"]), r["target"]) for r in json.loads(PAPER_FILE.read_text())}
    found: dict[str, int] = {}
    for path in sorted(ROOT.rglob("*")):
        if not path.is_file() or SKIP & set(path.relative_to(ROOT).parts):
            continue
        if path.stat().st_size > 20_000_000:
            continue
        for name, text in documents(path):
            keys = {
                (tuple(int(n) for n in re.findall(r"\d+", numbers)), target)
                for form in FORMS
                for numbers, target in form.findall(text)
            }
            held = len(keys & paper)
            if held > MOST:
                found[name] = held
    assert not found, (
        f"files holding the paper's puzzles (countdown.json is non-commercial; strip them with "
        f"python docs/results/countdown-paper-split/puzzles.py FILE...): {found}"
    )
