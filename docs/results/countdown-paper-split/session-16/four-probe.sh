#!/bin/bash
# Session 16, on the CPU: what a 0.5B adapter answers on the paper's 4-number TRAINING puzzles
# (never its test puzzles), greedy, with task.shots=2 (z3's prompt) or 3 (a worked example of
# 4 numbers added, evolm/task/countdown/shots.py).
#   bash four-probe.sh NAME SHOTS ADAPTER|none [N] [TOKENS]
# NUMBERS=3: the 3-number training puzzles instead (session 24's probe of z5 under z3's prompt).
# The eval reads a file built in $TMPDIR from ../shared/data (not kept): countdown.json's 200
# training records as its training split, and their 104 4-number records again as its test
# split, of which the first N are evaluated. One generation with es.alpha=1e-30 (the mean does
# not move), so the final eval is the adapter's. ~22-28 min for 52 puzzles x 640 tokens on the
# developers' 2-core machine (fp32, server.threads=null: both cores).
set -e
NAME=$1; SHOTS=$2; ADAPTER=$3; N=${4:-52}; TOKENS=${5:-640}
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${COUNTDOWN_JSON:-$HERE/../../../../../shared/data/countdown/countdown.json}
NUMBERS=${NUMBERS:-4}
FILE=${TMPDIR:-/tmp}/countdown-train$NUMBERS.json
python3 -c "import json, sys; d = json.load(open(sys.argv[1]))[:200]
json.dump(d + [r for r in d if len(r['numbers']) == int(sys.argv[3])], open(sys.argv[2], 'w'))" \
  "$DATA" "$FILE" "$NUMBERS"
INIT=(); [ "$ADAPTER" != none ] && INIT=("lora.init_from=$ADAPTER")
python -m evolm task=countdown model=qwen2.5-coder-0.5b-instruct \
  task.data_file="$FILE" task.train_size=200 'task.train_n=[3]' task.chat_template=true \
  task.shots="$SHOTS" task.max_new_tokens="$TOKENS" task.eval_samples="$N" \
  'task.stop=["</answer>"]' task.format_weight=0 task.samples_per_generation=1 \
  es.population_size=2 es.sigma=0.0005 es.alpha=1e-30 generations=1 eval_start=false \
  eval_every=1000 train_mean=false server.threads=null logger=none callbacks.samples.count="$N" \
  "${INIT[@]}" hydra.run.dir="outputs/four-probe/$NAME"
