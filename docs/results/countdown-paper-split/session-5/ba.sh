#!/bin/bash
# issue 39 item 7: experiment=qwen05_countdown's generation time, before (be7a9ea) then after (this tree), GPU 3;
# then the S reward on all 200 training puzzles on GPU 3 until the lease's end.  ba.sh T_END_EPOCH
set -u
export EVOLM_CACHE_DIR=/root/evcache PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=3
[ -f /root/q05.gguf ] || cat /root/p/q05.part-* > /root/q05.gguf
mkdir -p /root/runs
for t in before after; do
  d=/root/before2; [ $t = after ] && d=/root/evolm-run
  (cd $d && timeout 420 python3 -m evolm experiment=qwen05_countdown model.gguf_file=/root/q05.gguf logger=none generations=15 eval_every=100 hydra.run.dir=/root/runs/ba-$t) > /root/runs/ba-$t.log 2>&1
  echo "ba-$t rc=$?" >> /root/runs/ba.done
done
left=$(( $1 - $(date +%s) ))
if [ $left -gt 420 ]; then
  C="task.chat_template=true time_budget_s=$((left-400)) eval_every_s=100000"
  S="task.blind_baseline=true task.closeness_weight=0.5 task.format_weight=0.02 $C"
  cd /root/evolm-run && bash docs/results/countdown-paper-split/device/launch.sh $left 3 s200 q15 "$S seed=0"
fi
