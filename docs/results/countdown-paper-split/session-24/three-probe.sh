#!/bin/bash
# Session 24, on the CPU: what a 0.5B adapter answers on the paper's 3-number TRAINING puzzles
# (never its test puzzles), greedy, with task.shots=2 (z3's prompt): does z5 (trained on the
# 4-number puzzles with task.shots=3) keep z3's 3-number search under z3's prompt?
# session-16/four-probe.sh with the 3-number records as the test split.
#   bash three-probe.sh NAME SHOTS ADAPTER|none [N] [TOKENS]
# ~11 min for 48 puzzles x 640 tokens on the developers' 2-core machine (fp32, both cores).
set -e
NAME=$1; SHOTS=$2; ADAPTER=$3; N=${4:-52}; TOKENS=${5:-640}
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${COUNTDOWN_JSON:-$HERE/../../../../../shared/data/countdown/countdown.json}
FILE=${TMPDIR:-/tmp}/countdown-train3.json
python3 -c "import json, sys; d = json.load(open(sys.argv[1]))[:200]
json.dump(d + [r for r in d if len(r['numbers']) == 3], open(sys.argv[2], 'w'))" "$DATA" "$FILE"
INIT=(); [ "$ADAPTER" != none ] && INIT=("lora.init_from=$ADAPTER")
python -m evolm task=countdown model=qwen2.5-coder-0.5b-instruct \
  task.data_file="$FILE" task.train_size=200 'task.train_n=[3]' task.chat_template=true \
  task.shots="$SHOTS" task.max_new_tokens="$TOKENS" task.eval_samples="$N" \
  'task.stop=["</answer>"]' task.format_weight=0 task.samples_per_generation=1 \
  es.population_size=2 es.sigma=0.0005 es.alpha=1e-30 generations=1 eval_start=false \
  eval_every=1000 train_mean=false server.threads=null logger=none callbacks.samples.count="$N" \
  "${INIT[@]}" hydra.run.dir="outputs/three-probe/$NAME"
