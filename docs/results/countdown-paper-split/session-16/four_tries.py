"""How far a 0.5B's search gets on 4-number puzzles (session 16's CPU probe): per answers file
(``four-probe-*.jsonl.xz``, or a run's ``samples/gen-NNN.jsonl``), the puzzles answered right,
the tries (``Try a op b = x, then x op c = y, ...: yes|not T``) whose every step computes right
over exactly the puzzle's numbers, and the puzzles where such a try reaches the target.

    python four_tries.py FILE...
"""

import operator
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from puzzles import rows  # committed answers name the paper's puzzles by id

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
STEP = re.compile(r"(-?\d+) ([-+*/]) (-?\d+) = (-?[\d.]+)")
TRY = re.compile(r"Try ([^:]*?): (?:yes|not)")


def right_chain(chain: str, numbers: list[int]) -> float | None:
    """The value a try reaches, where every step computes right, each step goes on from the
    last, and the numbers used are exactly the puzzle's; else None."""
    found = [STEP.fullmatch(s.strip()) for s in chain.split(", then ")]
    if not all(found):
        return None
    steps = [m.groups() for m in found]  # type: ignore[union-attr]
    for a, op, b, result in steps:
        if (op == "/" and int(b) == 0) or abs(OPS[op](int(a), int(b)) - float(result)) > 1e-9:
            return None
    if any(steps[i][3] != steps[i + 1][0] for i in range(len(steps) - 1)):
        return None
    used = sorted([int(steps[0][0])] + [int(s[2]) for s in steps])
    return float(steps[-1][3]) if used == sorted(numbers) else None


def main() -> None:
    for name in sys.argv[1:]:
        puzzles = right = tries = good = reached = 0
        for numbers, target, row in rows(Path(name)):
            puzzles += 1
            right += row["scores"]["accuracy"] > 0
            values = [right_chain(c, numbers) for c in TRY.findall(row["completion"])]
            tries += len(values)
            good += sum(v is not None for v in values)
            reached += any(v is not None and abs(v - float(target)) < 1e-9 for v in values)
        print(
            f"{name}: {puzzles} puzzles, {right} right; {tries} tries, {good} right chains over "
            f"the puzzle's numbers; {reached} puzzles with one reaching the target"
        )


if __name__ == "__main__":
    main()
