"""``python -m benchmarks.score_host``: host time to score one countdown generation (CPU only).

One generation of the paper's setting is 6,000 rows: its 200 training puzzles x 30 members.
This scores 6,000 distinct real completions against those puzzles, taken from committed runs'
answers:
- long: the 1.5B's searches (session 6's p0, ~700 tokens);
- short: the 0.5B's template answers (q0, ~31 tokens).

It scores them with evolm's ``Countdown.score``, plus the row statistics and the set summary
that every generation logs. The same rows are also scored with the paper's regexes for the
format reward and the answer block, patched in, as scoring ran before they were evaluated with
``str.find``. Best of ``--repeat`` runs each, side by side in one process.

    PYTHONPATH=. python -m benchmarks.score_host --data countdown.json   (the paper's file)
"""

from __future__ import annotations

import argparse
import functools
import json
import lzma
import platform
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from evolm.evaluate import completion_stats
from evolm.task.countdown import Countdown, reward, shortcuts
from evolm.task.countdown import task as countdown_task

ANSWERS = Path(__file__).resolve().parents[1] / "docs/results/countdown-paper-split/session-6"
SOURCES = {"long": "p0-gen042-answers.jsonl.xz", "short": "q0-gen134-answers.jsonl.xz"}
MEMBERS = 30
FULL = re.compile(r"^<think>.*?</think>\n<answer>.*?</answer>$", re.DOTALL)
THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def regex_format(completion: str) -> float:
    """The format reward as the paper's reward script computes it, with its regexes."""
    text = "<think>" + completion
    if FULL.match(text):
        return 1.0
    return round(0.1 * bool(THINK.search(text)) + 0.5 * bool(ANSWER.search(text)), 6)


def regex_answer(completion: str) -> str | None:
    """The last answer block's stripped text as the paper's script finds it (re.findall)."""
    found = ANSWER.findall(completion)
    return found[-1].strip() if found else None


@contextmanager
def paper_regexes() -> Iterator[None]:
    """The format reward and answer extraction as the paper's regexes, everywhere they are used."""
    saved = reward.format_reward, reward.extract_answer
    modules = (reward, shortcuts, countdown_task)
    try:
        reward.format_reward = regex_format
        for module in modules:
            module.extract_answer = regex_answer  # type: ignore[attr-defined]
        yield
    finally:
        reward.format_reward = saved[0]
        for module in modules:
            module.extract_answer = saved[1]  # type: ignore[attr-defined]


def score_generation(task: Countdown, rows: list, texts: list[str]) -> None:
    """What a generation's host does with its rows' texts: scores, row statistics, summary."""
    scores = task.score(rows, texts)
    completion_stats(texts)
    task.summarize(rows, scores)


def best_of(repeat: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="the paper's countdown.json")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    task = Countdown(data_file=args.data, samples_per_generation=None, chat_template=True)
    examples = task.train_examples(1)
    rows = list(examples) * MEMBERS
    table = []
    for name, file in SOURCES.items():
        with lzma.open(ANSWERS / file, "rt") as f:
            answers = [json.loads(line)["completion"] for line in f]
        # member m's row of puzzle p: a distinct text (the member's number inside the think)
        texts = [f"{i // len(examples)} " + answers[i % len(answers)] for i in range(len(rows))]
        generation = functools.partial(score_generation, task, rows, texts)
        now = best_of(args.repeat, generation)
        with paper_regexes():
            before = best_of(args.repeat, generation)
        tokens = sum(len(t) for t in texts) / len(texts)
        table.append((name, tokens, before, now))
    print(
        f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}"
    )
    print("| completions | characters | paper's regexes | evolm | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name, chars, before, now in table:
        print(f"| {name} | {chars:,.0f} | {before:.3f} s | {now:.3f} s | {before / now:.1f}x |")


if __name__ == "__main__":
    main()
