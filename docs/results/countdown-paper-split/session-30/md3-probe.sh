#!/bin/bash
# Session 30, on the CPU: a 0.5B (adapter or base) on the 3-number puzzles that need * or /
# (family muldiv): the paper's 20 such training puzzles and the first 20 such test puzzles,
# greedy, two worked examples (evolm's, or PROBE_SHOTS=mul: md3_probe.py's), 1,024 tokens, as a
# run's eval asks them. ~10-12 min an arm on the developers' 2-core machine. From the repo root:
#   bash docs/results/countdown-paper-split/session-30/md3-probe.sh NAME ADAPTER|none cur|mul
# Strip the answers (puzzles.py) before committing them.
set -e
NAME=$1; ADAPTER=$2; export PROBE_SHOTS=$3
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${EVOLM_COUNTDOWN_JSON:-$HERE/../../../../../shared/data/countdown/countdown.json}
FILE=${TMPDIR:-/tmp}/md3.json
python3 - "$FILE" "$DATA" <<'PY'
import json, sys
from evolm.task.countdown.shortcuts import classify
paper = json.load(open(sys.argv[2]))
def md3(records):
    return [{"numbers": r["numbers"], "target": str(r["target"])} for r in records
            if len(r["numbers"]) == 3 and classify(r["numbers"], r["target"]).family == "muldiv"]
rows = md3(paper[:200]) + md3(paper[200:])[:20]  # 20 training, then 20 test puzzles
json.dump([{"numbers": [1, 2, 3], "target": "6"}] + rows, open(sys.argv[1], "w"))  # 1 to train
PY
INIT=(); [ "$ADAPTER" != none ] && INIT=(lora.init_from="$ADAPTER")
python3 "$HERE/md3_probe.py" task=countdown model=qwen2.5-coder-0.5b-instruct \
  task.data_file="$FILE" task.train_size=1 task.chat_template=true \
  task.shots=2 task.max_new_tokens=1024 task.eval_samples=40 \
  'task.stop=["</answer>"]' task.format_weight=0 task.samples_per_generation=1 \
  es.population_size=2 es.sigma=0.0005 es.alpha=1e-30 generations=1 eval_start=false \
  eval_every=1000 train_mean=false server.threads=null logger=none callbacks.samples.count=40 \
  "${INIT[@]}" hydra.run.dir="outputs/md3-probe/$NAME"
