#!/bin/bash
# Session 9's lease (2 x H200), what ran, from the repo root on the device machine after
# device/setup.sh and the 0.5B's and 1.5B's GGUF pieces in /root/p (END: the device clock by
# which every run must have exited).
L=docs/results/countdown-paper-split/device/launch.sh; K=docs/results/countdown-paper-split/check_chat.py
R="task.chat_template=true task.blind_baseline=true task.closeness_weight=0.5"
T=$(( END - $(date +%s) )); B=$(( T - 300 ))
# r0, r1: the answer + 0.5 closeness, minus the answer form's blind mean of both, + 0.02 format
bash $L $T 0 r0 q05 "$R task.format_weight=0.02 seed=0 time_budget_s=$B eval_every_s=400 server.gpu_memory_utilization=0.6"
bash $L $T 1 r1 q05 "$R task.format_weight=0.02 seed=1 time_budget_s=$B eval_every_s=400 eval_start=false server.gpu_memory_utilization=0.6"
# the outside checks, one beside each 0.5B run (M: the converted 1.5B)
CUDA_VISIBLE_DEVICES=0 python3 $K $M p0-gen042-adapter chk-p0-gen042.json 2000 1024 400 &
CUDA_VISIBLE_DEVICES=1 python3 $K $M p1-gen027-adapter chk-p1-gen027.json 2000 1024 400 &
# 7 minutes later r1 (format only, like r0) was stopped at generation 52 for r2: no format term
T=$(( END - $(date +%s) )); B=$(( T - 200 ))
bash $L $T 1 r2 q05 "$R task.format_weight=0 seed=0 time_budget_s=$B eval_every_s=100000 eval_start=false server.gpu_memory_utilization=0.6"
