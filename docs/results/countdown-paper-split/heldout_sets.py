"""evolm's two template-free held-out sets of the paper-split runs, for the outside check.

``experiment=qwen05_paper_countdown`` (and its ``_shots`` and 1.5B variants) evaluates, beside
the paper's 2,000 test puzzles, 200 puzzles of evolm's tree generator and 200 with uniform
targets, none solvable by a fixed template (``extra_evals.tree_free`` and
``extra_evals.uniform_free``). This writes those puzzles in countdown.json's fields (``id``: the
position in the file, ``context``: the paper's verbatim prompt, ``numbers``, ``target``), so
that check_chat.py (plain transformers + peft) asks them as the runs did::

  python heldout_sets.py OUT_DIR     # OUT_DIR/tree_free.json, OUT_DIR/uniform_free.json
  PUZZLES_JSON=OUT_DIR/uniform_free.json SHOTS_JSON=session-25/shots-by-count.json \\
    python check_chat.py MODEL_DIR ADAPTER_DIR uniform-check.json 200

They are evolm's own puzzles, not the paper's: committing them and their answers is fine.
``tests/test_outside_check.py`` checks that they are the experiment's sets and that
check_chat.py sends them evolm's messages.
"""

import json
import sys
from pathlib import Path

from evolm.task.countdown import Countdown
from evolm.task.countdown.reward import paper_prompt

SETS = ("tree_free", "uniform_free")
HELD = {"seed": 1, "generate_count": 201, "train_size": 1, "samples_per_generation": 1,
        "eval_samples": 200, "drop_templates": "test"}  # fmt: skip
"""The fields of the experiment's ``extra_evals`` that choose the puzzles (its prompt fields,
``chat_template`` and ``shots``, follow the run's task and are check_chat.py's business)."""


def records(name: str) -> list[dict]:
    """The set ``name`` (``tree_free`` or ``uniform_free``) in countdown.json's fields."""
    generator = name.removesuffix("_free")
    held = Countdown(generator=generator, **HELD)
    refs = [e.reference for e in held.eval]
    return [{"id": i, "context": paper_prompt(r["numbers"], r["target"]),
             "numbers": list(r["numbers"]), "target": str(r["target"])}
            for i, r in enumerate(refs)]  # fmt: skip


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name in SETS:
        (out / f"{name}.json").write_text(json.dumps(records(name), indent=1))
        print(f"{out / name}.json")


if __name__ == "__main__":
    main()
