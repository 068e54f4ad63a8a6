#!/bin/bash
# Do the members at es.sigma=S keep what the unperturbed 0.5B solves? (session 14, on the CPU)
# One generation of Qwen2.5-Coder-0.5B-Instruct with two worked examples on N of the paper's
# 3-number training puzzles, population P, 256 new tokens, the answer alone; the members'
# train/* figures of generation 1 against the same run at sigma ~0 (every member the mean).
#   EVOLM_COUNTDOWN_JSON=countdown.json bash sigma-probe.sh S [N] [P]
# (~17-21 min each on the developers' 2-core machine, fp32).
S=$1; N=${2:-24}; P=${3:-4}
python -m evolm task=countdown model=qwen2.5-coder-0.5b-instruct \
  task.data_file="${EVOLM_COUNTDOWN_JSON:-countdown.json}" task.train_size=200 'task.train_n=[3]' \
  task.chat_template=true task.shots=2 task.samples_per_generation="$N" task.max_new_tokens=256 \
  'task.stop=["</answer>"]' task.format_weight=0 task.eval_samples=2 es.population_size="$P" \
  es.sigma="$S" es.alpha=1.0 generations=1 eval_start=false logger=none \
  hydra.run.dir="outputs/sigma-probe/s$S"
