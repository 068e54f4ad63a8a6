#!/bin/bash
# Issue 37 on GPU 1: the base 1.5B's generation (qwen05_countdown's shape: 6,000 rows, 1,024 tokens)
# with server.speculate=0, then =N; one after the other; bash sp.sh END N...
set -u
END=$1; shift
export EVOLM_CACHE_DIR=/root/evcache PYTHONUNBUFFERED=1
cd /root/evolm-run
(for n in 0 "$@"; do
  T=$(( END - $(date +%s) )); [ $T -gt 60 ] || break
  CUDA_VISIBLE_DEVICES=1 timeout -s TERM $T python3 -m evolm experiment=qwen05_countdown \
    model=qwen2.5-coder-1.5b-instruct model.gguf_file=/root/q15.gguf logger=none generations=3 \
    eval_start=false eval_every=1000 server.speculate=$n hydra.run.dir=/root/runs/sp$n \
    > /root/runs/sp$n.log 2>&1 < /dev/null
done) > /dev/null 2>&1 < /dev/null &
disown
echo "launched sp: 0 $*"
