#!/bin/bash
# Issue 37's speculation A/B on the run a user starts (experiment=qwen05_countdown), past the
# generation where its tail appears (~24): one GPU of a device lease, after the countdown-paper
# lease's setup.sh, the 0.5B's pieces in /root/p and `launch.sh 0 0 - q05 convert`
# (docs/results/countdown-paper-split/device/).
#   MORE=8 bash docs/benchmarks/qwen05-speculate-ab.sh WARM_SECONDS SPECULATE...   e.g. 330 0 4
# 1. warm: the run with server.speculate=0, stopped by SIGTERM after WARM_SECONDS (it
#    checkpoints the generation it reached and exits 143);
# 2. for each SPECULATE, one after the other: a copy of it with server.speculate=N in its
#    config.yaml (a server setting: not part of the run's identity), resumed for MORE
#    generations (then SIGTERM; unset: to generation 40).
# The copies start from the same checkpoint (the same mean), so their generations compare one
# to one: time/generation_s, time/engine_generate_s, time/engine_tail_s, the fitness.
# Records of 2026-12-06 (H100): docs/benchmarks/h100-qwen05-speculate-ab-*.jsonl.
set -u
export EVOLM_CACHE_DIR=/root/evcache PYTHONUNBUFFERED=1
R=/root/specab; mkdir -p "$R"; cd /root/evolm-run
warm=$1; shift
timeout -s TERM "$warm" python3 -m evolm experiment=qwen05_countdown \
  model=qwen2.5-coder-0.5b-instruct model.gguf_file=/root/q05.gguf logger=none generations=40 \
  eval_start=false eval_every=1000 hydra.run.dir=$R/warm > $R/warm.log 2>&1
echo "warm: exit $?, checkpoints: $(ls $R/warm/checkpoints | grep 'pt$' | tr '\n' ' ')"
from=$(ls $R/warm/checkpoints | grep 'pt$' | tail -1 | sed 's/gen-0*//; s/\.pt//')
for n in "$@"; do
  rm -rf "$R/sp$n"; cp -r "$R/warm" "$R/sp$n"
  sed -i "s/^  speculate: [0-9]*$/  speculate: $n/" "$R/sp$n/config.yaml"
  grep -q "^  speculate: $n$" "$R/sp$n/config.yaml" || { echo "no speculate key"; exit 1; }
  python3 -m evolm resume=$R/sp$n > $R/sp$n.log 2>&1 &
  pid=$!
  if [ -n "${MORE:-}" ]; then
    until grep -q "generation $((from + MORE))/" $R/sp$n.log || ! kill -0 $pid 2>/dev/null; do sleep 2; done
    sleep 1; kill -TERM $pid 2>/dev/null
  fi
  wait $pid
  echo "sp$n: exit $?"
done
echo done > $R/DONE
