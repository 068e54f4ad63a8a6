#!/bin/bash
# Session 10's lease (2 GPUs), from the repo root on the device machine after device/setup.sh.
#   bash go.sh f05 END     once the 0.5B's pieces are in /root/p: GPU 0, issue 36
#   bash go.sh cmp15 END   once the 1.5B's pieces are in /root/p: GPU 1, issue 38
# END: the device clock (epoch seconds) by which every run must have exited.
# What happened: f05 ran (its T did not count launch.sh's 95 s conversion, so it outlived the
# lease; launch.sh now subtracts it). cmp15 was started with 986 s left, too little for two 1.5B
# methods in turn, and stopped at once; GPU 1 ran sp.sh (issue 37) instead.
set -u
L=docs/results/countdown-paper-split/device/launch.sh; what=$1; END=$2
T=$(( END - $(date +%s) ))
if [ "$what" = f05 ]; then
  # the 0.5B in q0's setting (chat prompt, the answer alone, seed 0) in full mode: the paper's method
  B=$(( T - 150 ))
  bash $L $T 0 f05 q05 "task.chat_template=true es.mean=full seed=0 time_budget_s=$B eval_every_s=$(( B / 2 + 1 ))"
else
  # ES vs GRPO on the 1.5B, one after the other on GPU 1, GRPO first (its time is the less known)
  export EVOLM_CACHE_DIR=/root/evcache EVOLM_COUNTDOWN_JSON=/root/countdown.json PYTHONUNBUFFERED=1
  [ -f /root/q15.gguf ] || cat /root/p/q15.part-* > /root/q15.gguf
  cd /root/evolm-run
  CUDA_VISIBLE_DEVICES=1 setsid nohup timeout -s TERM $T python3 -m baselines.compare \
    experiment=qwen15_paper_countdown model.gguf_file=/root/q15.gguf task.eval_samples=500 \
    budget_minutes=${BUDGET:-7} eval_every_minutes=${EVERY:-3.5} methods=grpo,es \
    grpo.prompts_per_step=16 grpo.num_generations=8 grpo.micro_batch=32 grpo.learning_rate=5e-5 \
    out=/root/runs/cmp15 > /root/runs/cmp15.log 2>&1 < /dev/null &
  echo "launched cmp15 on GPU 1 for $T s"
fi
