"""The paper's puzzles stay out of evolm's tree: committed answers name each puzzle by its ``id``.

``countdown.json`` (Qiu et al. 2025's code release) is licensed for non-commercial academic use
only, so evolm does not copy it: tests and scripts read it from ``../shared/data``. An eval's
saved answers (a run's ``samples/gen-NNN.jsonl``: prompt, completion, scores) and an outside
check's (``check_chat.py``: numbers, target, completion, correct) hold the puzzles, so before
they are committed ``strip`` replaces each paper puzzle's prompt, or numbers and target, by
``"puzzle": <its id in countdown.json>``. What is not one of the paper's puzzles (evolm's own
generated held-out sets) is left as it is; in other text files (the CPU probes' logs) a puzzle
printed as ``{'numbers': [...], 'target': '...'}`` becomes ``{'puzzle': <id>}``. A puzzle left
in any of these forms afterwards is an error. ``rows`` joins them back for reading.

  python puzzles.py FILE...   # strip in place: .jsonl, .json, .txt, .xz of one, .tar.xz

COUNTDOWN_JSON=PATH: the paper's file (default: ../shared/data/countdown/countdown.json beside
the checkout).
"""

import io
import json
import lzma
import os
import re
import sys
import tarfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path

DATA = Path(__file__).resolve().parents[4] / "shared" / "data" / "countdown" / "countdown.json"
PUZZLE = re.compile(
    r"Using the numbers \[([\d ]+)\], create an equation that equals (-?\d+(?:\.\d+)?)\."
)
REPR = re.compile(r"\{'numbers': \[([\d, ]+)\], 'target': '(-?\d+(?:\.\d+)?)'\}")
"""A puzzle printed as a Python dict (the CPU probes' logs)."""
FIELDS = re.compile(r'"numbers":\s*\[([\d,\s]+)\],\s*"target":\s*"?(-?\d+(?:\.\d+)?)')
"""A puzzle as JSON fields, compact or indented."""


def held(text: str) -> set[int]:
    """The ids of the paper's puzzles ``text`` holds, in any of the three forms."""
    keys = set()
    for pattern in (PUZZLE, REPR, FIELDS):
        keys |= {(tuple(map(int, re.findall(r"\d+", n))), t) for n, t in pattern.findall(text)}
    return {ids()[k] for k in keys if k in ids()}


@cache
def records() -> dict[int, dict]:
    """The paper's records by id."""
    path = Path(os.environ.get("COUNTDOWN_JSON", DATA))
    return {r["id"]: r for r in json.loads(path.read_text())}


@cache
def ids() -> dict[tuple[tuple[int, ...], str], int]:
    """Each paper puzzle's id by (numbers, target): the 2,200 pairs are distinct."""
    out = {(tuple(r["numbers"]), r["target"]): i for i, r in records().items()}
    assert len(out) == len(records()), "two records share numbers and target"
    return out


def asked(prompt: str) -> tuple[tuple[int, ...], str] | None:
    """``(numbers, target)`` of the puzzle a prompt asks (its last one: worked examples come
    first), or None."""
    found = PUZZLE.findall(prompt)
    if not found:
        return None
    numbers, target = found[-1]
    return tuple(int(n) for n in numbers.split()), target


def puzzle_of_prompt(prompt: str) -> int | None:
    """The id of the paper puzzle a prompt asks, or None where it is not one of the paper's."""
    key = asked(prompt)
    return None if key is None else ids().get(key)


def _strip_row(row: dict) -> dict:
    if "prompt" in row and isinstance(row["prompt"], str):
        puzzle = puzzle_of_prompt(row["prompt"])
        if puzzle is not None:
            return {"puzzle": puzzle, **{k: v for k, v in row.items() if k != "prompt"}}
    if "numbers" in row and "target" in row:
        puzzle = ids().get((tuple(row["numbers"]), str(row["target"])))
        if puzzle is not None:
            rest = {k: v for k, v in row.items() if k not in ("numbers", "target")}
            return {"puzzle": puzzle, **rest}
    return row


def _strip_repr(found: re.Match) -> str:
    key = (tuple(int(n) for n in found.group(1).split(",")), found.group(2))
    return f"{{'puzzle': {ids()[key]}}}" if key in ids() else found.group(0)


def _strip_text(name: str, text: str) -> str:
    """A .jsonl or .json document with its paper puzzles replaced by ids; another text with
    its printed puzzle dicts replaced. A puzzle left in any form is an error."""
    if not name.endswith((".jsonl", ".json")):
        out = REPR.sub(_strip_repr, text)
    elif name.endswith(".jsonl"):
        lines = [json.dumps(_strip_row(json.loads(line))) for line in text.splitlines() if line]
        out = "".join(line + "\n" for line in lines)
    else:
        doc = json.loads(text)
        if isinstance(doc, dict) and isinstance(doc.get("answers"), list):
            doc["answers"] = [_strip_row(a) for a in doc["answers"]]
        out = json.dumps(doc, indent=1)
    left = held(out)
    if left:
        raise ValueError(f"{name}: {len(left)} of the paper's puzzles left in a form not stripped")
    return out


def strip(path: Path) -> None:
    """Rewrite ``path`` (.jsonl, .json, either .xz-compressed, or a .tar.xz of .jsonl files)
    with its paper puzzles replaced by ids, atomically."""
    data = path.read_bytes()
    if path.name.endswith(".tar.xz"):
        out = io.BytesIO()
        with (
            tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as src,
            tarfile.open(fileobj=out, mode="w:xz") as dst,
        ):
            for member in src.getmembers():
                if not (member.isfile() and member.name.endswith((".jsonl", ".json"))):
                    dst.addfile(member, src.extractfile(member) if member.isfile() else None)
                    continue
                text = _strip_text(member.name, src.extractfile(member).read().decode())  # type: ignore[union-attr]
                body = text.encode()
                member.size = len(body)
                dst.addfile(member, io.BytesIO(body))
        new = out.getvalue()
    elif path.suffix == ".xz":
        inner = path.name.removesuffix(".xz")
        new = lzma.compress(_strip_text(inner, lzma.decompress(data).decode()).encode())
    else:
        new = _strip_text(path.name, data.decode()).encode()
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(new)
    tmp.replace(path)


def rows(path: Path) -> Iterator[tuple[list[int], str, dict]]:
    """Each answer of a saved eval (``samples/gen-NNN.jsonl``, stripped or not, .xz or not)
    with its puzzle: ``(numbers, target, row)``."""
    raw = path.read_bytes()
    text = (lzma.decompress(raw) if path.suffix == ".xz" else raw).decode()
    for line in text.splitlines():
        row = json.loads(line)
        if "puzzle" in row:
            record = records()[row["puzzle"]]
            yield record["numbers"], record["target"], row
        else:
            key = asked(row["prompt"])
            assert key is not None, row["prompt"]
            yield list(key[0]), key[1], row


if __name__ == "__main__":
    for name in sys.argv[1:]:
        strip(Path(name))
        print(f"stripped {name}")
