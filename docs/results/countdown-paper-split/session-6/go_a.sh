#!/bin/bash
# session 8, phase A (the 1.5B's pieces are in /root/p): bash go_a.sh END_EPOCH
# GPU 0: p0 resumed from generation 20 (855 s of training) with a new budget, no mid evals;
# GPU 1: p1 = p0's setting with seed 1 (no start eval: p0's generation 0 is the same base);
# GPU 3: the outside check of p0's generation-22 adapter on all 2,000, then the 0.5B's seed 1
#        once go_b has converted the 0.5B.
# Every run must have exited by END_EPOCH (device clock).

L=docs/results/countdown-paper-split/device/launch.sh; END=$1
T=$(( END - $(date +%s) - 80 )); B=$(( T - 240 ))  # the first launch converts the GGUF (~80 s)
echo "phase A: T=$T B=$B"
bash $L $T 0 p0 q15 "resume time_budget_s=$((855 + B)) eval_every_s=100000"
T=$(( END - $(date +%s) )); B=$(( T - 240 ))
echo "p1: T=$T B=$B"
bash $L $T 1 p1 q15 "task.chat_template=true time_budget_s=$B eval_every_s=100000 eval_start=false seed=1"
cd /root/evolm-run && M=$(ls -d /root/evcache/models/qwen2.5-coder-1.5b-instruct-*/ | head -1)
CUDA_VISIBLE_DEVICES=3 python3 docs/results/countdown-paper-split/check_chat.py $M /root/p0-adapter /root/runs/chk-p0.json 2000 1024 400 > /root/runs/chk-p0.log 2>&1
until [ -f /root/q05.converted ]; do sleep 5; done
left=$(( END - $(date +%s) ))
[ $left -gt 420 ] && bash $L $left 3 q1 q05 "task.chat_template=true time_budget_s=$((left - 270)) eval_every_s=100000 eval_start=false seed=1"
