"""Probe (CPU, plain transformers; evolm's task for the prompts and the scores): does the base
Qwen2.5-Coder-0.5B-Instruct (chat prompt) solve any of the paper's 3-number training puzzles
(``task.train_n=[3]``), greedy or sampled, and are its right answers templates?

    EVOLM_COUNTDOWN_JSON=countdown.json python probe05.py MODEL_DIR N K MAX_NEW TEMP [SHOTS [DROP]]

N puzzles, K completions each (TEMPERATURE 0: greedy), MAX_NEW new tokens, cut after the first
``</answer>``. SHOTS (0-2): ``task.shots``, worked examples given first as earlier chat turns
(``evolm.task.countdown.shots``), a search that fails, then checks and answers. DROP:
``task.drop_templates`` (``train``: only the puzzles no template solves; ``train+size``: nor
a size-order rule, ``task.drop_size_rules``; session 12). Prints a
JSON summary, the first 12 answers' ends and every right answer.
"""

import json
import os
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from evolm.sampling import cut_at_stop
from evolm.task.countdown import Countdown


def main() -> None:
    model_dir, n, k, max_new, temp = sys.argv[1], *map(int, sys.argv[2:5]), float(sys.argv[5])
    shots = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    drop, _, size = (sys.argv[7] if len(sys.argv) > 7 else "").partition("+")
    task = Countdown(
        data_file=os.environ.get("EVOLM_COUNTDOWN_JSON", "countdown.json"),
        train_size=200,
        samples_per_generation=None,
        train_n=[3],
        chat_template=True,
        format_weight=0.0,
        stop=["</answer>"],
        shots=shots,
        drop_templates=drop or None,
        drop_size_rules=size == "size",
    )
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    examples = task.train[:n]
    prompts = [
        tok.apply_chat_template(e.prompt, tokenize=False, add_generation_prompt=True)
        + e.assistant_prefix
        for e in examples
    ]
    torch.manual_seed(0)
    start = time.time()
    enc = tok(prompts, return_tensors="pt", padding=True)
    sampling = {"do_sample": True, "temperature": temp, "top_k": 0} if temp > 0 else {}
    rows, outs = [], []
    for _ in range(k):
        with torch.no_grad():
            ids = model.generate(
                **enc, max_new_tokens=max_new, pad_token_id=tok.pad_token_id, **sampling
            )
        texts = tok.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        outs += [cut_at_stop(t, ("</answer>",))[0] for t in texts]
        rows += examples
    scores = task.score(rows, outs)
    right = [i for i, a in enumerate(scores["accuracy"]) if a > 0]
    summary = {
        "n": n,
        "k": k,
        "shots": shots,
        "drop": sys.argv[7] if len(sys.argv) > 7 else None,
        "temperature": temp,
        "max_new": max_new,
        "seconds": round(time.time() - start),
        "accuracy": sum(scores["accuracy"]) / len(outs),
        "right": len(right),
        "right_templates": sum(1 for i in right if scores["_template_answer"][i] > 0),
        "format": sum(scores["format_reward"]) / len(outs),
    }
    print(json.dumps(summary))
    for i in range(min(len(outs), 12)):
        end = outs[i][-200:].replace("\n", " | ")
        print("--", rows[i].reference, "acc", scores["accuracy"][i], "|", end)
    for i in right:
        end = outs[i][-160:].replace("\n", " | ")
        print("RIGHT", rows[i].reference, scores["_template_answer"][i], "|", end)


if __name__ == "__main__":
    main()
