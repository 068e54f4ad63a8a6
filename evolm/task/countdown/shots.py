"""Worked examples shown before the puzzle (``task.shots``), as earlier chat turns.

Each is a puzzle not in the paper's file (two of three numbers, then one of four) and the
assistant's reply after the prompt's ``<think>``: tries that fail their check, then one that
passes, then the answer. It shows the procedure (compute, compare with the target, go on) on
puzzles unlike a template: the first tries are rejected. Every step's arithmetic is right and
a try says ``yes`` exactly when it reaches the target (tested).

Issue 36's probes (the base Qwen2.5-Coder-0.5B-Instruct, greedy, the first 24 of the paper's
3-number training puzzles): zero-shot it solves none. With two examples of one failed try each
(session 11) it followed the procedure but accepted its second try whatever it gave (0 of 24);
with these (two failed tries each, ``+``/``-`` first) it rejects misses and solves 5 of 24 by
that search (session 12). Trained with two, on 3-number puzzles only, it never solved a 4-number
one: it runs 3-number tries, or loops one try to the token budget (session 15's z3). The third
example, of four numbers (``task.shots=3``), shows the same search one step longer, with ``+``
and ``-`` alone: on the CPU (session 16, z3's adapter, 52 of the paper's 4-number training
puzzles) 67 of its 350 tries were right chains over the puzzle's four numbers and 2 reached the
target, against 20 of 374 and none with two examples, and 51 and 1 with a 4-number example that
multiplies (the model copied its ``* 6`` step with numbers not in the puzzle). None of the
three answered a puzzle right.
"""

from __future__ import annotations

SHOTS: tuple[tuple[tuple[int, ...], int, str], ...] = (
    (
        (8, 25, 3),
        30,
        " Try 25 + 8 = 33, then 33 + 3 = 36: not 30. Try 25 - 8 = 17, then 17 + 3 = 20: not 30."
        " Try 25 + 8 = 33, then 33 - 3 = 30: yes, and each number is used once. </think>\n"
        "<answer> (25 + 8) - 3 </answer>",
    ),
    (
        (4, 6, 2),
        14,
        " Try 6 + 4 = 10, then 10 + 2 = 12: not 14. Try 6 * 2 = 12, then 12 + 4 = 16: not 14."
        " Try 4 * 2 = 8, then 8 + 6 = 14: yes, and each number is used once. </think>\n"
        "<answer> (4 * 2) + 6 </answer>",
    ),
    (
        (9, 40, 5, 14),
        58,
        " Try 40 + 9 = 49, then 49 + 14 = 63, then 63 + 5 = 68: not 58. Try 40 - 9 = 31, then"
        " 31 + 14 = 45, then 45 + 5 = 50: not 58. Try 40 + 14 = 54, then 54 + 9 = 63, then"
        " 63 - 5 = 58: yes, and each number is used once. </think>\n"
        "<answer> ((40 + 14) + 9) - 5 </answer>",
    ),
)
"""``(numbers, target, reply)``: the reply continues the assistant prefix."""
