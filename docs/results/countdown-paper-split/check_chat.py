"""An outside check of a chat-prompt countdown adapter with plain transformers + peft (no evolm
code): the paper's test puzzles, the chat prompt rebuilt from each record's own verbatim prompt
with the tokenizer's chat template, greedy decoding cut after the first ``</answer>`` (as the runs'
``task.stop``), scored by ../shared/tools/countdown_check.py's reward and family rule.

  python check_chat.py MODEL_DIR ADAPTER_DIR OUT.json [N] [MAX_NEW] [BATCH]

ADAPTER_DIR ``-``: the base model alone, asked the same way.
N: the first N of the 2,000 test puzzles (default 2000; FIRST=K: the N from test puzzle K on);
MAX_NEW new tokens (default 1024); BATCH puzzles per ``generate`` call (default 100 on a GPU, 20
on the CPU). The answers name each puzzle by its ``id`` in countdown.json (``puzzles.py``).
Runs on a GPU when there is one (bf16), else on the CPU (float32).
SHOTS_JSON=FILE (a run with ``task.shots``): the worked examples' user and assistant messages,
put between the system message and the puzzle's, as the run showed them. evolm writes them:
``python -c "import json; from evolm.task.countdown import Countdown; print(json.dumps(Countdown(
data_file='countdown.json', chat_template=True, shots=2).train[0].prompt[1:-1]))"``
(session-12/shots.json). A run with examples by count (``task.shots={3:2,4:3}``) takes a JSON
object of such lists keyed by the count of numbers (``{"3": [...], "4": [...]}``), each puzzle
getting its count's examples (session-25/shots-by-count.json).
PUZZLES_JSON=FILE: other puzzles than the paper's test split, in countdown.json's fields (``id``,
``context``, ``numbers``, ``target``): evolm's template-free held-out sets, as heldout_sets.py
writes them. Their answers also carry each puzzle's numbers and target (they are evolm's own).
"""

import json
import os
import re
import sys
import time
from pathlib import Path

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "shared" / "tools"))
from countdown_check import family, reward

DATA = Path(__file__).resolve().parents[4] / "shared" / "data" / "countdown" / "countdown.json"
PREFIX = "Let me solve this step by step.\n<think>"
SHOTS = json.loads(Path(os.environ["SHOTS_JSON"]).read_text()) if "SHOTS_JSON" in os.environ else []


def messages(record: dict, shots: list | dict) -> list[dict]:
    """The record's verbatim prompt as system (its first sentence) + user (the rest) messages, with
    the worked examples between them (``shots``: one list, or lists keyed by the count of
    numbers): what ``task.chat_template=true`` sends before the assistant's opening."""
    system, rest = re.match(r"(.*?the answer\.)(Using .*)", record["context"], re.DOTALL).groups()
    user = rest.removesuffix(PREFIX)
    shots = shots[str(len(record["numbers"]))] if isinstance(shots, dict) else shots
    return [{"role": "system", "content": system}, *shots, {"role": "user", "content": user}]


def chat_prompt(tok, record: dict) -> str:
    """The prompt text: :func:`messages` in the tokenizer's chat template + the assistant's
    opening."""
    chat = tok.apply_chat_template(
        messages(record, SHOTS), tokenize=False, add_generation_prompt=True
    )
    return chat + PREFIX


def main() -> None:
    model_dir, adapter, out = sys.argv[1:4]
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 2000
    max_new = int(sys.argv[5]) if len(sys.argv) > 5 else 1024
    gpu = torch.cuda.is_available()
    first = int(os.environ.get("FIRST", "0"))
    puzzles = os.environ.get("PUZZLES_JSON")
    source = json.loads(Path(puzzles).read_text() if puzzles else DATA.read_text())
    records = (source if puzzles else source[-2000:])[first : first + n]
    tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.bfloat16 if gpu else torch.float32
    )
    model = model.to("cuda" if gpu else "cpu")
    if adapter != "-":  # "-": the base model, asked the same way
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    start, texts = time.time(), []
    batch = int(sys.argv[6]) if len(sys.argv) > 6 else (100 if gpu else 20)
    for i in range(0, len(records), batch):
        chunk = [chat_prompt(tok, r) for r in records[i : i + batch]]
        enc = tok(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
        enc = enc.to(model.device)
        with torch.no_grad():
            ids = model.generate(
                **enc, max_new_tokens=max_new, do_sample=False, stop_strings=["</answer>"],
                tokenizer=tok, pad_token_id=tok.pad_token_id,
            )  # fmt: skip
        for t in tok.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True):
            texts.append(t.split("</answer>")[0] + "</answer>" if "</answer>" in t else t)
        print(f"{len(texts)}/{len(records)} in {time.time() - start:.0f} s", flush=True)
        result = summary(
            records[: len(texts)], texts, model_dir, adapter, first, max_new, start, bool(puzzles)
        )
        tmp = Path(f"{out}.tmp")  # after every batch, whole: a check cut short keeps its answers
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out)
    print(json.dumps({k: v for k, v in result.items() if k != "answers"}))


def summary(
    records: list[dict], texts: list[str], model_dir: str, adapter: str, first: int,
    max_new: int, start: float, own: bool = False,
) -> dict:  # fmt: skip
    """The check's record of the puzzles answered so far (``own``: evolm's puzzles, PUZZLES_JSON,
    whose answers carry their numbers and target)."""
    scores = [reward(t, r["numbers"], r["target"]) for t, r in zip(texts, records, strict=True)]
    by: dict[str, list[int]] = {}
    for r, s in zip(records, scores, strict=True):
        by.setdefault(family(r), [0, 0])
        by[family(r)][0] += 1
        by[family(r)][1] += s[2] > 0
    return {
        "model": model_dir, "adapter": adapter, "first": first, "puzzles": len(records),
        "max_new_tokens": max_new,
        "accuracy": sum(s[2] > 0 for s in scores) / len(records),
        "format": sum(s[1] for s in scores) / len(records),
        "by_family": {f: f"{c}/{t}" for f, (t, c) in sorted(by.items())},
        "seconds": round(time.time() - start),
        # the paper's puzzles by id (countdown.json is non-commercial: not copied, puzzles.py);
        # other puzzles (PUZZLES_JSON) with their numbers and target
        "answers": [{"puzzle": r["id"],
                     **({"numbers": r["numbers"], "target": r["target"]} if own else {}),
                     "completion": t, "correct": s[2] > 0}
                    for r, t, s in zip(records, texts, scores, strict=True)],
    }  # fmt: skip


if __name__ == "__main__":
    main()
