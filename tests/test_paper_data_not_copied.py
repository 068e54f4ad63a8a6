"""The paper's countdown.json is non-commercial: evolm reads it from ../shared/data and never
copies it. Committed records name its puzzles by id (docs/results/countdown-paper-split/
puzzles.py strips them); this fails when a file in the tree holds them again (a run's
``samples/`` committed as they came off the GPU)."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import re
import subprocess
import tarfile
import zipfile
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


TARS = (".tar", ".tar.xz", ".txz", ".tar.gz", ".tgz", ".tar.bz2")
UNPACK = {".xz": lzma.decompress, ".gz": gzip.decompress, ".bz2": bz2.decompress}


def tree_files() -> list[Path]:
    """The files the project would commit: tracked, and untracked but not ignored, by git's own
    ignore rules (so the virtual environments, 6 GB in CI, are never walked)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True, text=True,
    ).stdout  # fmt: skip
    return sorted(ROOT / name for name in listed.split("\0") if name)


def documents(path: Path) -> Iterator[tuple[str, str]]:
    """``(name, text)`` of ``path``, decompressed and unpacked (.xz, .gz, .bz2, tar files of any
    of them, .zip); nothing for a binary file."""
    data = path.read_bytes()
    if path.name.endswith(TARS):
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            for member in tar.getmembers():
                if member.isfile():
                    body = tar.extractfile(member).read()  # type: ignore[union-attr]
                    yield from _text(f"{path}:{member.name}", body)
        return
    if path.suffix == ".zip":
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for info in archive.infolist():
                if not info.is_dir():
                    yield from _text(f"{path}:{info.filename}", archive.read(info))
        return
    if path.suffix in UNPACK:
        data = UNPACK[path.suffix](data)
    yield from _text(str(path), data)


def _text(name: str, data: bytes) -> Iterator[tuple[str, str]]:
    if b"\0" not in data[:4096]:
        yield name, data.decode(errors="replace")


def puzzles_in(text: str) -> set[tuple[tuple[int, ...], str]]:
    """Every ``(numbers, target)`` the text states, in any of FORMS."""
    return {
        (tuple(int(n) for n in re.findall(r"\d+", numbers)), target)
        for form in FORMS
        for numbers, target in form.findall(text)
    }


def paper_puzzles() -> set[tuple[tuple[int, ...], str]]:
    return {(tuple(r["numbers"]), r["target"]) for r in json.loads(PAPER_FILE.read_text())}


needs_paper = pytest.mark.skipif(
    not PAPER_FILE.is_file(), reason="../shared/data/countdown is not beside"
)


@needs_paper
def test_no_file_in_the_tree_holds_the_papers_puzzles() -> None:
    paper = paper_puzzles()
    found: dict[str, int] = {}
    for path in tree_files():
        if not path.is_file():  # tracked, deleted in the work tree
            continue
        if path.stat().st_size > 20_000_000:
            continue
        for name, text in documents(path):
            held = len(puzzles_in(text) & paper)
            if held > MOST:
                found[name] = held
    assert not found, (
        f"files holding the paper's puzzles (countdown.json is non-commercial; strip them with "
        f"python docs/results/countdown-paper-split/puzzles.py FILE...): {found}"
    )


def _pack(kind: str, path: Path, body: bytes) -> None:
    """Write ``body`` as one member of an archive, or compressed, as ``kind`` says."""
    if kind in TARS:
        mode = {".tar": "w", ".tar.xz": "w:xz", ".txz": "w:xz", ".tar.gz": "w:gz", ".tgz": "w:gz"}
        with tarfile.open(path, mode.get(kind, "w:bz2")) as tar:
            info = tarfile.TarInfo("run/samples/eval.jsonl")
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    elif kind == ".zip":
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("samples/eval.jsonl", body)
    else:
        compress = {".xz": lzma.compress, ".gz": gzip.compress, ".bz2": bz2.compress}
        path.write_bytes(compress[kind](body) if kind in compress else body)


@needs_paper
@pytest.mark.parametrize("kind", [".jsonl", ".xz", ".gz", ".bz2", *TARS, ".zip"])
def test_the_scan_finds_puzzles_in_every_container(tmp_path: Path, kind: str) -> None:
    """A run's answers, committed as they came off the GPU, are found however they are packed."""
    records = json.loads(PAPER_FILE.read_text())[-MOST - 1 :]
    body = "\n".join(
        json.dumps({"prompt": r["context"], "numbers": r["numbers"], "target": r["target"]})
        for r in records
    ).encode()
    path = tmp_path / f"answers{kind}"
    _pack(kind, path, body)
    (name, text), *rest = documents(path)
    assert not rest and str(path) in name
    assert len(puzzles_in(text) & paper_puzzles()) == MOST + 1
