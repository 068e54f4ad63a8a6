#!/bin/bash
# The 0.5B comparison on ONE GPU, in the background: ES, then GRPO, each BUDGET_MINUTES of
# training (issue 36's 0.5B setting, experiment=qwen05_paper_countdown_shots: the chat prompt
# with two worked examples, the paper's 96 three-number training puzzles). After
# countdown-paper-split/device/setup.sh, the pieces in /root/p and
# `bash launch.sh 0 0 - q05 convert` (which converts the GGUF once and freezes the tree in
# /root/evolm-run).   bash run05.sh BUDGET_MINUTES EVAL_EVERY_MINUTES [more overrides]
# GRPO's setting, from the 1.5B's (81-100% of its groups of 8 all scored 0, so most carried no
# gradient): groups of 16 of 8 prompts (the same 128 completions a step), sampled at
# temperature 0.7, the learning rate that moved the 1.5B (5e-5). Later overrides win.
set -u
CMP=${CMP:-/root/cmp05}
export EVOLM_CACHE_DIR=/root/evcache EVOLM_COUNTDOWN_JSON=/root/countdown.json PYTHONUNBUFFERED=1
cd /root/evolm-run
setsid nohup python3 -m baselines.compare experiment=qwen05_paper_countdown_shots \
  model=qwen2.5-coder-0.5b-instruct model.gguf_file=/root/q05.gguf task.eval_samples=500 \
  budget_minutes="$1" eval_every_minutes="$2" \
  grpo.prompts_per_step=8 grpo.num_generations=16 grpo.micro_batch=32 grpo.learning_rate=5e-5 \
  grpo.temperature=0.7 out="$CMP" "${@:3}" > "$CMP.log" 2>&1 < /dev/null &
echo "started $CMP: budget $1 min, evals every $2 min ${*:3}"
