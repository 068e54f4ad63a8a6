#!/bin/bash
# Session 12 (one H200): the 0.5B with two worked examples (task.shots=2), two runs side by side
# on the one GPU, each capped at 3,000 slots (~53 GB of KV cache at ~1,420 positions: both fit,
# whichever plans first; a share of the memory would not: a plan subtracts what the other holds),
# after
# `bash device/setup.sh`, the 8 pieces of the 0.5B's GGUF in /root/p and
# `bash device/launch.sh 0 0 - q05 convert`.
#   bash go.sh SECONDS BUDGET_S EVAL_EVERY_S
# s3: trained on the paper's 3-number training puzzles (task.train_n=[3]); sa: on all 200.
T=$1; B=$2; E=$3
d=docs/results/countdown-paper-split/device
common="task.chat_template=true task.shots=2 time_budget_s=$B eval_every_s=$E seed=0"
common="$common server.max_batch_rows=3000"
bash $d/launch.sh "$T" 0 s3 q05 "$common task.train_n=[3]"
bash $d/launch.sh "$T" 0 sa q05 "$common"
