#!/bin/bash
# The outside check (plain transformers + peft, check_chat.py) of adapters on evolm's two
# template-free held-out sets (200 puzzles each), asked as the run was (SHOTS, below):
#   bash heldout_check.sh NAME ADAPTER_DIR [NAME ADAPTER_DIR ...]     (ADAPTER_DIR -: the base)
# writes /root/runs/NAME-{uniform,tree}_free-check.json (answers and summary) and .log, and
# prints each summary. After setup.sh, the model's pieces and `bash launch.sh 0 0 - q05 convert`
# (the converted model is in /root/evcache). Foreground: start it with `setsid nohup ... &`.
# MODEL=qwen2.5-coder-1.5b-instruct for the 1.5B (default: the 0.5B); SHOTS=FILE for the worked
# examples (default: session 25's by count, as z5 was asked), SHOTS= (empty) for none (p0, p1);
# SETS="tree_free" for one set; BATCH=N puzzles per generate call (default 100);
# PARALLEL=1: every check at once, side by side on the GPU (session 28: four 0.5B checks with
# BATCH=200 in 197-215 s); with $OUT set (a device call) the finished checks are copied there.
set -u
cd /root/evolm-run  # launch.sh's frozen copy of the tree
model=$(ls -d /root/evcache/models/${MODEL:-qwen2.5-coder-0.5b-instruct}-* | head -1)
shots=${SHOTS-docs/results/countdown-paper-split/session-25/shots-by-count.json}
[ -f /root/held/uniform_free.json ] || PYTHONPATH=. python3 docs/results/countdown-paper-split/heldout_sets.py /root/held
check() {  # NAME ADAPTER SET
  env PUZZLES_JSON=/root/held/$3.json ${shots:+SHOTS_JSON=$shots} \
    python3 docs/results/countdown-paper-split/check_chat.py "$model" "$2" \
    /root/runs/$1-$3-check.json 200 1024 "${BATCH:-100}" > /root/runs/$1-$3-check.log 2>&1
  echo "$1 $3: $(tail -n 1 /root/runs/$1-$3-check.log | cut -c1-300)"
}
while [ $# -ge 2 ]; do
  for s in ${SETS:-uniform_free tree_free}; do
    if [ -n "${PARALLEL:-}" ]; then check "$1" "$2" "$s" & else check "$1" "$2" "$s"; fi
  done
  shift 2
done
wait
[ -n "${OUT:-}" ] && cp /root/runs/*-check.json "$OUT"/ 2>/dev/null
exit 0
