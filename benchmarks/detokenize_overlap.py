"""``python -m benchmarks.detokenize_overlap``: host time after the engine to turn one
generation's token rows into completions, decoded at the end vs as rows finish (issue 37).

One generation of the paper's countdown setting is 6,000 rows. Their tokens here are real, the
answers of ``benchmarks.score_host``: ``--answers long``, the 1.5B's searches (session 6's p0
at generation 42, ~750 tokens, 61% of them at the budget), or ``short``, the 0.5B's templates.
They are tokenized with the model's tokenizer, each row ended by an EOS and
padded to the width ``--width``. The engine is played by a loop that retires rows the way the
scheduler does, every 8 decode steps, each row when its tokens end, in ``--waves`` waves of
slots, sleeping ``--step-ms`` per step: a GPU decode step, during which the host waits on the
device with the GIL released. Only the host work is real; what it measures is the time from the
engine's end until every completion is ready:
- at the end: :meth:`Texts.completions` of the whole tensor (evolm before this change);
- streamed: :class:`RowDecoder`, rows decoded on a worker thread as they finish.
Best of ``--repeat`` runs each, side by side in one process. The two results are checked equal.

    PYTHONPATH=. python -m benchmarks.detokenize_overlap --model <dir of a Qwen2.5 model>
"""

from __future__ import annotations

import argparse
import json
import lzma
import platform
import time
from collections.abc import Callable

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks.score_host import ANSWERS, SOURCES
from evolm.engine.texts import RowDecoder, Texts

ROWS = 6000
CHECK_EVERY = 8  # decode steps between the scheduler's host syncs


def token_rows(texts: Texts, width: int, source: str) -> tuple[torch.Tensor, list[int]]:
    """``[ROWS, width]`` real completion tokens, each row then an EOS and pads; the lengths."""
    with lzma.open(ANSWERS / SOURCES[source], "rt") as f:
        answers = [json.loads(line)["completion"] for line in f]
    assert texts.tokenizer is not None
    encoded = [
        texts.tokenizer(a, add_special_tokens=False)["input_ids"][: width - 1] for a in answers
    ]
    out = torch.full((ROWS, width), texts.pad_id, dtype=torch.long)
    lengths = []
    for row in range(ROWS):
        ids = [*encoded[row % len(encoded)], texts.eos_ids[0]]
        out[row, : len(ids)] = torch.tensor(ids)
        lengths.append(len(ids))
    return out, lengths


def play_engine(
    lengths: list[int], waves: int, step_s: float, retired: Callable[[list[int]], None]
) -> None:
    """Retire the rows wave by wave, each at the check after its last token, sleeping each step."""
    per_wave = -(-len(lengths) // waves)
    for start in range(0, len(lengths), per_wave):
        wave = range(start, min(start + per_wave, len(lengths)))
        steps = max(lengths[r] for r in wave)
        for check in range(CHECK_EVERY, steps + CHECK_EVERY, CHECK_EVERY):
            time.sleep(CHECK_EVERY * step_s)
            done = [r for r in wave if check - CHECK_EVERY < lengths[r] <= check]
            if done:
                retired(done)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Qwen2.5 model directory (tokenizer)")
    parser.add_argument("--width", type=int, default=1024, help="max new tokens")
    parser.add_argument("--waves", type=int, default=2, help="waves of slots (6,000 rows)")
    parser.add_argument("--step-ms", type=float, default=4.0, help="one decode step's time")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--answers", choices=sorted(SOURCES), default="long")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the engine's default on CPUs
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    texts = Texts(model, AutoTokenizer.from_pretrained(args.model))
    tokens, lengths = token_rows(texts, args.width, args.answers)
    step_s = args.step_ms / 1000

    def at_end() -> tuple[float, float, list]:
        begin = time.perf_counter()
        play_engine(lengths, args.waves, step_s, lambda rows: None)
        engine_end = time.perf_counter()
        out = texts.completions(tokens)
        return engine_end - begin, time.perf_counter() - engine_end, out

    def streamed() -> tuple[float, float, list]:
        decoder = RowDecoder(texts, ROWS, (), ROWS // 16)
        begin = time.perf_counter()
        play_engine(lengths, args.waves, step_s, lambda rows: decoder.retired(rows, tokens))
        engine_end = time.perf_counter()
        out = decoder.finish(tokens)
        return engine_end - begin, time.perf_counter() - engine_end, out

    results = {}
    for name, run in (("at the end", at_end), ("streamed", streamed)):
        runs = [run() for _ in range(args.repeat)]
        results[name] = (min(r[0] for r in runs), min(r[1] for r in runs), runs[0][2])
    plain, stream = results["at the end"], results["streamed"]
    assert [(str(a), a.token_ids) for a in plain[2]] == [(str(b), b.token_ids) for b in stream[2]]
    tokens_per_row = sum(lengths) / len(lengths)
    print(
        f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch "
        f"thread(s), python {platform.python_version()}; {ROWS} rows of {tokens_per_row:.0f} "
        f"tokens (width {args.width}), {args.waves} waves, {args.step_ms} ms a step"
    )
    print("| detokenize | engine (played) | host after the engine |")
    print("|---|---:|---:|")
    for name, (engine_s, after_s, _) in results.items():
        print(f"| {name} | {engine_s:.2f} s | {after_s:.3f} s |")
    print(f"ratio: {plain[1] / stream[1]:.1f}x less host time after the engine")


if __name__ == "__main__":
    main()
