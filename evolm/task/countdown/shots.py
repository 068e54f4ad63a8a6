"""Worked examples shown before the puzzle (``task.shots``), as earlier chat turns.

Each is a puzzle of three numbers, not in the paper's file, and the assistant's reply after the
prompt's ``<think>``: one try that fails its check, then one that passes, then the answer. It
shows the procedure (compute, compare with the target, go on) on puzzles unlike a template:
the first try is rejected. Issue 36's probe: the base Qwen2.5-Coder-0.5B-Instruct, which solves
none of the paper's 3-number training puzzles zero-shot, follows this procedure with two shots
(it computes and rejects its first try), though not yet to right answers.
"""

from __future__ import annotations

SHOTS: tuple[tuple[tuple[int, ...], int, str], ...] = (
    (
        (8, 25, 3),
        30,
        " Try 8 + 3 = 11, then 25 + 11 = 36: not 30. Try 25 + 8 = 33, then 33 - 3 = 30: yes,"
        " and each number is used once. </think>\n<answer> (25 + 8) - 3 </answer>",
    ),
    (
        (4, 6, 2),
        14,
        " Try 4 + 6 = 10, then 10 + 2 = 12: not 14. Try 4 * 2 = 8, then 8 + 6 = 14: yes, and"
        " each number is used once. </think>\n<answer> (4 * 2) + 6 </answer>",
    ),
)
"""``(numbers, target, reply)``: the reply continues the assistant prefix."""
