"""Session 30's CPU probe: ``python -m evolm`` with other worked examples (``PROBE_SHOTS=mul``).

evolm's examples (``evolm.task.countdown.shots.SHOTS``) search with ``+``/``-`` first; with
``PROBE_SHOTS=mul`` the first two are replaced, for this process only, by two whose searches
reach the target with ``*`` and with ``/``: does the 0.5B then solve the puzzles that need them?
Any other value keeps evolm's own. The arguments are Hydra overrides, as ``python -m evolm``'s.
Run by md3-probe.sh.
"""

import os
import sys

import evolm.task.countdown.task as countdown_task

MUL = (
    (
        (7, 3, 12),
        33,
        " Try 12 + 7 = 19, then 19 + 3 = 22: not 33. Try 12 * 3 = 36, then 36 - 7 = 29: not 33."
        " Try 7 * 3 = 21, then 21 + 12 = 33: yes, and each number is used once. </think>\n"
        "<answer> (7 * 3) + 12 </answer>",
    ),
    (
        (36, 4, 5),
        14,
        " Try 36 - 4 = 32, then 32 - 5 = 27: not 14. Try 36 / 4 = 9, then 9 + 5 = 14: yes, and"
        " each number is used once. </think>\n<answer> (36 / 4) + 5 </answer>",
    ),
)
if os.environ.get("PROBE_SHOTS") == "mul":
    countdown_task.SHOTS = MUL + countdown_task.SHOTS[2:]

from evolm.__main__ import main  # noqa: E402  (after the examples are set)

sys.argv[0] = "evolm"
main()
