#!/bin/bash
# session 8, phase B (the 0.5B's pieces are in /root/p): bash go_b.sh END_EPOCH
# GPU 2: q0 = the 0.5B in p0's setting, seed 0, its start evaluated and one mid eval.
L=docs/results/countdown-paper-split/device/launch.sh; END=$1
T=$(( END - $(date +%s) - 40 )); B=$(( T - 360 ))  # the launch converts the GGUF first
echo "phase B: T=$T B=$B"
bash $L $T 2 q0 q05 "task.chat_template=true time_budget_s=$B eval_every_s=$(( B / 2 + 1 )) seed=0"
