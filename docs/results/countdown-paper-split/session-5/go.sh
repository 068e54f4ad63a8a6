#!/bin/bash
# issue 36, 1.5B chat: S = a reward no fixed form earns, with a small format term (seeds 0, 1), P = the paper's effective reward (format constant there -> 0), all 200 puzzles
L=docs/results/countdown-paper-split/device/launch.sh; T=$1; B=$2; E=$3
C="task.chat_template=true time_budget_s=$B eval_every_s=$E"
S="task.drop_templates=train task.samples_per_generation=116 task.blind_baseline=true task.closeness_weight=0.5 task.format_weight=0.02 $C"
bash $L $T 0 s0 q15 "$S seed=0" && bash $L $T 1 s1 q15 "$S seed=1" && bash $L $T 2 p0 q15 "task.format_weight=0 $C seed=0"
sleep 5; tail -n 3 /root/runs/*.log | cut -c1-200
