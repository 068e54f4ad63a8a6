#!/bin/bash
# session 6, lease 2: blind-baseline rewards without the format term, 1.5B chat (GPUs 0-2);
# the outside check of cd0's generation-161 adapter (GPU 3)
L=docs/results/countdown-paper-split/device/launch.sh; T=$1
S="task.drop_templates=train task.samples_per_generation=116 task.chat_template=true task.blind_baseline=true task.format_weight=0 time_budget_s=$2 eval_every_s=$3"
bash $L $T 0 s0 q15 "$S task.closeness_weight=0.5 seed=0" && bash $L $T 1 s1 q15 "$S task.closeness_weight=0.5 seed=1" && bash $L $T 2 n0 q15 "$S seed=0"
cd /root/evolm-run && M=$(ls -d /root/evcache/models/qwen2.5-coder-1.5b-instruct-*/ | head -1)
CUDA_VISIBLE_DEVICES=3 setsid nohup python3 docs/results/countdown-paper-split/check_chat.py $M /root/cd0-adapter /root/runs/chk-cd0.json > /root/runs/chk-cd0.log 2>&1 < /dev/null &
sleep 3; echo check launched on $M
