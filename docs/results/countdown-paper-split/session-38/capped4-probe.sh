#!/bin/bash
# Session 38, on the CPU (a 2-core AMD EPYC, evolm fp32, 40 min): an adapter on the first 50 of
# the 100 4-number puzzles that task.train_max_rule_share=0.1 keeps of the paper's 200 training
# puzzles (zr's training set, results page "Next"), greedy, zr's prompt (chat template, three
# worked examples for 4 numbers), 1,024 tokens, stop at </answer>, as zr's members see them.
#   bash capped4-probe.sh NAME ADAPTER [GGUF]
# Needs the paper's countdown.json ($EVOLM_COUNTDOWN_JSON or ../shared beside the checkout).
set -e
NAME=$1; ADAPTER=$2; GGUF=${3:-}
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${EVOLM_COUNTDOWN_JSON:-$HERE/../../../../../shared/data/countdown/countdown.json}
FILE=${TMPDIR:-/tmp}/capped4.json
python3 - "$DATA" "$FILE" <<'PY'
import json, sys
from evolm.task.countdown import Countdown
task = Countdown(data_file=sys.argv[1], train_max_rule_share=0.1, samples_per_generation=None,
                 eval_samples=None)
four = [e.reference for e in task.train if len(e.reference["numbers"]) == 4][:50]
rows = [{"numbers": r["numbers"], "target": str(r["target"])} for r in four]
json.dump([{"numbers": [1, 2, 3], "target": "6"}] + rows, open(sys.argv[2], "w"))  # 1 to train
PY
python -m evolm task=countdown model=qwen2.5-coder-0.5b-instruct ${GGUF:+model.gguf_file=$GGUF} \
  task.data_file="$FILE" task.train_size=1 task.chat_template=true \
  'task.shots={3:2,4:3}' task.max_new_tokens=1024 task.eval_samples=50 \
  'task.stop=["</answer>"]' task.format_weight=0 task.samples_per_generation=1 \
  es.population_size=2 es.sigma=0.0005 es.alpha=1e-30 generations=1 eval_start=false \
  eval_every=1000 train_mean=false server.threads=null logger=none callbacks.samples.count=50 \
  lora.init_from="$ADAPTER" hydra.run.dir="outputs/capped4-probe/$NAME"
