"""``task=conciseness``: answer as briefly as the shortest correct answer (the paper's task).

Reward per completion: ``-|len(completion) - len(answer)|`` in characters, on the completion
only. Data: JSON lines with ``question`` and ``answer`` (the paper's schema); the project ships
its own small set, used when no path is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources

from evolm.task.base import Example, Sampling, Scores, Task, read_jsonl_lines

FIELDS = ("question", "answer")


def bundled(name: str) -> str:
    """Path of a data file shipped with evolm (``conciseness/train.jsonl``...)."""
    return str(resources.files("evolm") / "data" / name)


class Conciseness(Task):
    """The conciseness task.

    Args:
        train_file: JSON lines (question, answer) the members are scored on every generation;
            ``None`` uses evolm's bundled examples.
        eval_file: held-out JSON lines for evaluating the mean; ``None``: bundled.
        chat_template: wrap questions in the model's chat template (the paper used raw text).
        max_new_tokens, temperature, top_p: decoding (greedy by default, as the paper).
        stop: stop strings (e.g. ``["\\n"]``): a completion ends after the first one.
    """

    def __init__(
        self,
        train_file: str | None = None,
        eval_file: str | None = None,
        chat_template: bool = False,
        max_new_tokens: int = 100,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] = (),
    ) -> None:
        stop = stop if isinstance(stop, str) else tuple(stop)  # a bare string: Sampling refuses
        self.sampling = Sampling(max_new_tokens, temperature, top_p, stop=stop)  # type: ignore[arg-type]
        self.chat_template = chat_template
        train_path = train_file or bundled("conciseness/train.jsonl")
        eval_path = eval_file or bundled("conciseness/eval.jsonl")
        train = read_jsonl_lines(train_path, "train_file", FIELDS)
        self.train = [self._example(r, where) for where, r in train]
        evals = read_jsonl_lines(eval_path, "eval_file", FIELDS)
        self.eval = [self._example(r, where) for where, r in evals]

    def _example(self, record: dict, source: str) -> Example:
        question = str(record["question"])
        prompt = [{"role": "user", "content": question}] if self.chat_template else question
        return Example(prompt=prompt, reference={"answer": str(record["answer"])}, source=source)

    def train_examples(self, generation: int) -> list[Example]:
        return self.train

    def eval_examples(self) -> list[Example]:
        return self.eval

    def score(self, examples: Sequence[Example], completions: Sequence[str]) -> Scores:
        rewards = [
            -abs(len(c) - len(e.reference["answer"]))
            for e, c in zip(examples, completions, strict=True)
        ]
        return {"reward": [float(r) for r in rewards]}
