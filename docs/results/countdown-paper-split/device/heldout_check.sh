#!/bin/bash
# The outside check (plain transformers + peft, check_chat.py) of adapters on evolm's two
# template-free held-out sets (200 puzzles each), asked as the run was (SHOTS, below):
#   bash heldout_check.sh NAME ADAPTER_DIR [NAME ADAPTER_DIR ...]
# writes /root/runs/NAME-{uniform,tree}_free-check.json (answers and summary) and .log, one set
# after the other. After setup.sh, the 8 pieces and `bash launch.sh 0 0 - q05 convert` (the
# converted model is in /root/evcache). Foreground: start it with `setsid nohup ... &`.
# MODEL=qwen2.5-coder-1.5b-instruct for the 1.5B (default: the 0.5B); SHOTS=FILE for the worked
# examples (default: session 25's by count, as z5 was asked), SHOTS= (empty) for none (p0, p1).
set -u
cd /root/evolm-run  # launch.sh's frozen copy of the tree
model=$(ls -d /root/evcache/models/${MODEL:-qwen2.5-coder-0.5b-instruct}-* | head -1)
shots=${SHOTS-docs/results/countdown-paper-split/session-25/shots-by-count.json}
[ -f /root/held/uniform_free.json ] || PYTHONPATH=. python3 docs/results/countdown-paper-split/heldout_sets.py /root/held
while [ $# -ge 2 ]; do
  for s in uniform_free tree_free; do
    env PUZZLES_JSON=/root/held/$s.json ${shots:+SHOTS_JSON=$shots} \
      python3 docs/results/countdown-paper-split/check_chat.py "$model" "$2" \
      /root/runs/$1-$s-check.json 200 > /root/runs/$1-$s-check.log 2>&1
    tail -n 3 /root/runs/$1-$s-check.log
  done
  shift 2
done
