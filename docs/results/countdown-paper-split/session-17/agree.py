"""evolm's answers against the outside check's on the same test puzzles: how many each solves,
how many both solve, and how often the two write the same final answer.

  python agree.py EVOLM_ANSWERS CHECK.json[.xz]...

EVOLM_ANSWERS: a run's saved eval (``gen-NNN.jsonl``, .xz or not) or ``ARCHIVE.tar.xz:MEMBER``
(``session-15/z3-answers.tar.xz:gen-055.jsonl``). Each CHECK is a ``check_chat.py`` record; the
figures are over the puzzles the checks answered, by the family rule of
../shared/tools/countdown_check.py (sum / pm / md).
"""

import json
import lzma
import re
import sys
import tarfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[5] / "shared" / "tools"))
from countdown_check import family
from puzzles import records

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def read(spec: str) -> bytes:
    """The bytes of a file, an .xz file, or ``ARCHIVE.tar.xz:MEMBER``."""
    if ".tar" in spec and ":" in spec:
        archive, member = spec.rsplit(":", 1)
        with tarfile.open(archive) as tar:
            return tar.extractfile(member).read()  # type: ignore[union-attr]
    raw = Path(spec).read_bytes()
    return lzma.decompress(raw) if spec.endswith(".xz") else raw


def final(completion: str) -> str:
    """The last ``<answer>`` tag's text, spaces removed (the paper's reward reads the last)."""
    found = ANSWER.findall(completion)
    return re.sub(r"\s+", "", found[-1]) if found else ""


def main() -> None:
    evolm = {}
    for line in read(sys.argv[1]).decode().splitlines():
        row = json.loads(line)
        evolm[row["puzzle"]] = (row["scores"]["accuracy"] == 1.0, final(row["completion"]))
    outside = {}
    for spec in sys.argv[2:]:
        for row in json.loads(read(spec))["answers"]:
            outside[row["puzzle"]] = (bool(row["correct"]), final(row["completion"]))
    count: Counter[str] = Counter()
    for pid, (right, answer) in outside.items():
        mine, own = evolm[pid]
        fam = family(records()[pid])
        count["puzzles"] += 1
        count["outside"] += right
        count["evolm"] += mine
        count["both"] += right and mine
        count["same answer"] += answer == own
        count[f"{fam} puzzles"] += 1
        count[f"{fam} outside"] += right
        count[f"{fam} evolm"] += mine
    n = count["puzzles"]
    for key in ("outside", "evolm", "both", "same answer"):
        print(f"{key:>12}: {count[key]:4d} of {n} ({100 * count[key] / n:.1f}%)")
    for fam in ("sum", "pm", "md"):
        print(
            f"{fam:>12}: outside {count[fam + ' outside']}/{count[fam + ' puzzles']}, "
            f"evolm {count[fam + ' evolm']}/{count[fam + ' puzzles']}"
        )


if __name__ == "__main__":
    main()
