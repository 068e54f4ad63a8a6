#!/bin/bash
# server.share_prefix off and on, one after the other, through the CLI users run: zr's setting
# (experiment=qwen05_paper_countdown_shots with three worked examples for 4 numbers, the paper's
# training puzzles thinned by task.train_max_rule_share=0.1, z5s2's adapter), shrunk to what a
# CPU runs in minutes: 2 members x 16 puzzles a generation, NEW_TOKENS new tokens (default 8:
# prefill is the work; 128: answers that end and score, members whose fitness differs),
# 2 generations, a final eval of 16 test puzzles and 2 of each held-out set. The same seed: the
# same members and puzzles, so every figure compares one to one.
#   [NEW_TOKENS=128] bash docs/benchmarks/cpu-qwen05-share-prefix.sh GGUF ADAPTER COUNTDOWN_JSON [OUT]
# Session 38 (2-core AMD EPYC, fp32): records docs/benchmarks/cpu-qwen05-share-prefix-*.jsonl
# (8 tokens) and cpu-qwen05-share-prefix-128-*.jsonl.
set -eu
GGUF=$1; ADAPTER=$2; DATA=$3; OUT=${4:-outputs/share-prefix-ab}
for share in false true; do
  python -m evolm experiment=qwen05_paper_countdown_shots model=qwen2.5-coder-0.5b-instruct \
    model.gguf_file="$GGUF" 'task.shots={3:2,4:3}' task.train_n=null \
    task.train_max_rule_share=0.1 task.data_file="$DATA" lora.init_from="$ADAPTER" seed=15 \
    generations=2 eval_start=false es.population_size=2 train_mean=false \
    task.samples_per_generation=16 task.max_new_tokens=${NEW_TOKENS:-8} task.eval_samples=16 \
    extra_evals.tree_free.eval_samples=2 extra_evals.uniform_free.eval_samples=2 \
    server.threads=null logger=none callbacks.samples.count=16 server.share_prefix=$share \
    hydra.run.dir="$OUT/$share" > "$OUT-$share.log" 2>&1
done
python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = {s: [json.loads(l) for l in open(out / s / "results.jsonl")] for s in ("false", "true")}
for plain, shared in zip(runs["false"], runs["true"], strict=True):
    same = [k for k in plain if k.split("/")[0] in ("train", "eval", "es")]
    differ = [k for k in same if plain[k] != shared.get(k)]
    times = {k.split("/")[-1]: (plain.get(k), shared.get(k)) for k in
             ("time/generation_s", "time/engine_prefill_s", "time/engine_prefix_copied",
              "time/eval_s") if k in plain}
    print(f"generation {plain['generation']}: {len(same)} figures, differ: {differ}; {times}")
for f in sorted((out / "false" / "samples").rglob("gen-*.jsonl")):
    a = [json.loads(l)["completion"] for l in open(f)]
    b = [json.loads(l)["completion"] for l in open(str(f).replace("/false/", "/true/"))]
    print(f"{f.relative_to(out / 'false' / 'samples')}: {sum(x == y for x, y in zip(a, b))} "
          f"of {len(a)} answers identical")
PY
