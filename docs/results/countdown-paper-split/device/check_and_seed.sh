#!/bin/bash
# One call, after setup.sh and the 8 pieces in /root/p (session 17's plan for a short lease):
# the outside check of z3's adapter (/root/z3-adapter) on all 2,000 test puzzles in the
# background, z3's second seed (z3s1) beside it on the same GPU, then both into $OUT.
#   bash check_and_seed.sh DEADLINE_S TRAIN_S
# DEADLINE_S: seconds from now when the files must be in $OUT (keep it under the call's limit);
# TRAIN_S: z3s1's time_budget_s (its final eval of ~2,400 puzzles takes ~2 minutes after it);
# 0: the check alone. BATCH=N: puzzles per generate call (default 500; a record after each).
set -u
t0=$(date +%s); deadline=$(( t0 + $1 )); d=$(cd "$(dirname "$0")" && pwd)
bash "$d/launch.sh" 0 0 - q05 convert
cd /root/evolm-run
model=$(ls -d /root/evcache/models/qwen2.5-coder-0.5b-instruct-* | head -1)
SHOTS_JSON=docs/results/countdown-paper-split/session-12/shots.json setsid nohup python3 \
  docs/results/countdown-paper-split/check_chat.py "$model" /root/z3-adapter \
  /root/runs/z3-check.json 2000 1024 ${BATCH:-500} > /root/runs/z3-check.log 2>&1 < /dev/null &
[ "$2" -gt 0 ] && bash "$d/pair.sh" $(( deadline - $(date +%s) - 25 )) z3s1 "experiment=qwen05_paper_countdown_shots \
seed=1 eval_start=false time_budget_s=$2 eval_every_s=100000"
while [ "$(date +%s)" -lt $(( deadline - 20 )) ]; do
  { [ "$2" = 0 ] || [ -f /root/runs/z3s1/adapter/adapter_model.safetensors ]; } && grep -q '"puzzles": 2000' \
    /root/runs/z3-check.json 2>/dev/null && break
  sleep 5
done
sleep 2; grep -h -E "generation|Error" /root/runs/z3s1.log | tail -n 3 | cut -c1-300
tail -c 400 /root/runs/z3-check.log; nvidia-smi --query-gpu=memory.used --format=csv,noheader
cp /root/runs/z3-check.json /root/runs/z3-check.log "$OUT/" 2>/dev/null
[ "$2" -gt 0 ] && bash "$d/collect.sh" z3s1
