"""How much does a countdown model multiply? Products in the search, and in the answers.

    python docs/results/countdown-paper-split/products.py CHECK.json[.xz] [...]

CHECK: an outside check's answers and summary (``check_chat.py``'s output, e.g.
``session-28/base-uniform_free-outside-check-h100.json.xz``). For each file: the accuracy by
family (``pm``: solvable with ``+``/``-`` alone; ``md``: needs ``*`` or ``/``), how many answers
try ``*`` anywhere, how many products ``a * b = c`` the searches write and how many of those are
right, and how many final answers hold ``*`` or ``/``. A model that stops trying ``*`` cannot
solve the ``md`` puzzles however well it searches: this says whether training narrowed the
search to ``+`` and ``-``.
"""

from __future__ import annotations

import json
import lzma
import re
import sys
from pathlib import Path

PRODUCT = re.compile(r"(-?\d+) \* (-?\d+) = (-?\d+)")
ANSWER_MD = re.compile(r"<answer>[^<]*[*/]")


def read(path: Path) -> dict:
    """The check's JSON (``.xz`` or plain)."""
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def products(check: dict) -> dict[str, object]:
    """The figures above for one check."""
    texts = [row["completion"] for row in check["answers"]]
    written = [m for text in texts for m in PRODUCT.findall(text)]
    return {
        "accuracy": check["accuracy"],
        "by_family": check["by_family"],
        "answers": len(texts),
        "try_mul": sum("*" in text for text in texts),
        "products": len(written),
        "products_right": sum(int(a) * int(b) == int(c) for a, b, c in written),
        "answers_md": sum(bool(ANSWER_MD.search(text)) for text in texts),
    }


def main(paths: list[str]) -> None:
    for path in paths:
        f = products(read(Path(path)))
        sys.stdout.write(
            f"{Path(path).name}: accuracy {f['accuracy']:.3f} {f['by_family']}; "
            f"{f['try_mul']} of {f['answers']} answers try *; {f['products']} products "
            f"written, {f['products_right']} right; {f['answers_md']} answers hold * or /\n"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
