"""The 0.5B's outside checks on both template-free sets, beside what never reads the target.

Session 37 (CPU): for every committed outside check of the 0.5B on evolm's two template-free
held-out sets (200 puzzles each), its accuracy, what the same answers' forms score written
blindly on that set's puzzles (session 36's ``blind_lift``: evolm's blind baseline,
:class:`evolm.task.countdown.blind.BlindRates`), the lift, and the gain over the base's
outside check of the same set. z5's recipe (z5, z5s1, z5s2) against za's (za, zas1:
``task.train_family=[addsub]`` from z5s2's adapter, seeds 13 and 14).

Run from the checkout's root (its output: ``draws.txt``):
``PYTHONPATH=. python docs/results/countdown-paper-split/session-37/draws.py``.
"""

from __future__ import annotations

import importlib.util
import json
import lzma
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent  # countdown-paper-split/
_spec = importlib.util.spec_from_file_location("za_forms", RESULTS / "session-36/za_forms.py")
assert _spec is not None and _spec.loader is not None
za_forms = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(za_forms)

CHECKS = {  # name: the session holding its two checks (<name>-<set>-outside-check-h100)
    "base": "session-28",
    "z5": "session-27",
    "z5s1": "session-28",
    "z5s2": "session-34",
    "za": None,  # uniform set in session 36, tree set in session 37
    "zas1": "session-37",
}
SETS = ("tree_free", "uniform_free")


def check_path(name: str, which: str) -> Path:
    session = CHECKS[name] or ("session-36" if which == "uniform_free" else "session-37")
    return RESULTS / session / f"{name}-{which}-outside-check-h100.json.xz"


def main() -> None:
    base: dict[str, float] = {}
    for which in SETS:
        print(f"{which}:")
        for name in CHECKS:
            with lzma.open(check_path(name, which)) as f:
                answers = json.load(f)["answers"]
            acc, blind = za_forms.blind_lift(answers)
            base.setdefault(which, acc)
            print(f"  {name:5s} accuracy {acc:6.1%} (over the base {100 * (acc - base[which]):+5.1f}),"
                  f" forms blindly {blind:6.2%}, lift {100 * (acc - blind):+5.1f}")


if __name__ == "__main__":
    main()
