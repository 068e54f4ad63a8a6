"""The 0.5B's outside checks on both template-free sets, beside what never reads the target.

Session 37 (CPU): for every committed outside check of the 0.5B on evolm's two template-free
held-out sets (200 puzzles each), and the 1.5B's, its accuracy, what the same answers' forms score
written blindly on that set's puzzles (session 36's ``blind_lift``: evolm's blind baseline,
:class:`evolm.task.countdown.blind.BlindRates`), the lift, and the gain over the base's outside
check of the same set; above each, what the best fixed rule scores on the set (since session 37 the
fixed rules include the first-negated ones, ``-a + b + c``). z5's recipe (z5, z5s1, z5s2) against
za's (za, zas1: ``task.train_family=[addsub]`` from z5s2's adapter, seeds 13 and 14).

Last, evolm's own final evals of za and zas1 (their saved answers: the 2,000 test puzzles and
both held-out sets) rescored with this session's rules: what the runs would have logged.

Run from the checkout's root (its output: ``draws.txt``):
``PYTHONPATH=. python docs/results/countdown-paper-split/session-37/draws.py``.
"""

from __future__ import annotations

import importlib.util
import json
import lzma
import sys
import tarfile
import tempfile
from pathlib import Path

from evolm.task.base import Example
from evolm.task.countdown import Countdown
from evolm.task.countdown.shortcuts import classify
from evolm.task.countdown.summary import puzzle_rates

RESULTS = Path(__file__).resolve().parent.parent  # countdown-paper-split/
_spec = importlib.util.spec_from_file_location("za_forms", RESULTS / "session-36/za_forms.py")
assert _spec is not None and _spec.loader is not None
za_forms = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(za_forms)
sys.path.insert(0, str(RESULTS))
from puzzles import rows  # noqa: E402  (the paper's puzzles joined back by id)

EVALS = {"za": ("session-36/za-answers.tar.xz", 56), "zas1": ("session-37/zas1-answers.tar.xz", 79)}
"""The final evals (evolm's own, on the GPU) rescored here with the rules of this session."""
KEYS = ("accuracy_mean", "shortcut_accuracy", "shortcut/first_negated", "template_share",
        "blind_accuracy", "accuracy_lift")  # fmt: skip

CHECKS = {  # model: {name: the session holding its checks (<name>-<set>-outside-check-h100)}
    "0.5B": {"base": "session-28", "z5": "session-27", "z5s1": "session-28",
             "z5s2": "session-34", "za": "session-36|session-37", "zas1": "session-37"},
    "1.5B": {"base15": "session-31", "p0": "session-31", "p1": "session-31",
             "p1c": "session-32"},
}  # fmt: skip
SETS = ("tree_free", "uniform_free")


def check_path(name: str, sessions: str, which: str) -> Path | None:
    """The committed check of ``name`` on ``which`` (za's uniform check is session 36's, its
    tree check session 37's); ``None`` where none was committed (p0's uniform one)."""
    for session in sessions.split("|"):
        path = RESULTS / session / f"{name}-{which}-outside-check-h100.json.xz"
        if path.is_file():
            return path
    return None


def best_rules(answers: list[dict]) -> str:
    """What fixed rules score on the set's puzzles (evolm's ``puzzle_rates``)."""
    rates = puzzle_rates([classify(r["numbers"], r["target"]) for r in answers])
    return (
        f"best fixed rule {rates['shortcut_accuracy']:.1%} (first-negated "
        f"{rates['shortcut/first_negated']:.1%}, size order {rates['shortcut/by_size']:.1%})"
    )


def main() -> None:
    for which in SETS:
        for model, names in CHECKS.items():
            base = None
            for name, sessions in names.items():
                path = check_path(name, sessions, which)
                if path is None:
                    print(f"  {name:6s} (no committed check)")
                    continue
                with lzma.open(path) as f:
                    answers = json.load(f)["answers"]
                if base is None:
                    print(f"{which}, {model}: {best_rules(answers)}")
                acc, blind = za_forms.blind_lift(answers)
                base = acc if base is None else base
                print(
                    f"  {name:6s} accuracy {acc:6.1%} (over the base {100 * (acc - base):+5.1f}),"
                    f" forms blindly {blind:6.2%}, lift {100 * (acc - blind):+5.1f}"
                )


def rescore() -> None:
    """evolm's summary of each final eval's saved answers, scored again by today's task (the
    runs logged ``shortcut_accuracy`` and ``template_share`` without the first-negated rules)."""
    task = Countdown(train_size=5, generate_count=12, samples_per_generation=2, eval_samples=None)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (archive, gen) in EVALS.items():
            with tarfile.open(RESULTS / archive) as tar:
                tar.extractall(tmp, filter="data")
            for which in ("", "tree_free/", "uniform_free/"):
                saved = list(rows(Path(tmp) / f"samples/{which}gen-{gen:03d}.jsonl"))
                examples = [Example(prompt="", reference={"numbers": n, "target": t})
                            for n, t, _ in saved]  # fmt: skip
                scores = task.score(examples, [r["completion"] for _, _, r in saved])
                out = task.summarize(examples, scores)
                out["accuracy_mean"] = sum(scores["accuracy"]) / len(saved)
                print(
                    f"{name:5s} eval {which.rstrip('/') or 'test'} ({len(saved)}): "
                    + ", ".join(f"{k} {out[k]:.3f}" for k in KEYS if k in out)
                )


if __name__ == "__main__":
    main()
    rescore()
