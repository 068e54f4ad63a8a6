#!/bin/bash
# Start the 1.5B comparison in the background on a 2-GPU device machine (ES on GPU 0, GRPO on
# GPU 1), after countdown-paper-split/device/setup.sh, the model's pieces in /root/p and
# `bash launch.sh 0 0 - q15 convert` (which converts the GGUF once and freezes the tree in
# /root/evolm-run).   bash run.sh BUDGET_MINUTES EVAL_EVERY_MINUTES [more overrides]
# Later overrides win: e.g. GRPO alone at another learning rate on GPU 1, into its own folder:
#   CMP=/root/g-lr1e-4 bash run.sh 5 2.5 methods=grpo devices=1 grpo.learning_rate=1e-4
set -u
CMP=${CMP:-/root/cmp}
export EVOLM_CACHE_DIR=/root/evcache EVOLM_COUNTDOWN_JSON=/root/countdown.json PYTHONUNBUFFERED=1
cd /root/evolm-run
setsid nohup python3 -m baselines.compare experiment=qwen15_paper_countdown \
  model.gguf_file=/root/q15.gguf task.eval_samples=500 \
  budget_minutes="$1" eval_every_minutes="$2" devices=0,1 \
  grpo.prompts_per_step=16 grpo.num_generations=8 grpo.micro_batch=32 grpo.learning_rate=5e-5 \
  out="$CMP" "${@:3}" > "$CMP.log" 2>&1 < /dev/null &
echo "started $CMP: budget $1 min, evals every $2 min ${*:3}"
