#!/bin/bash
# Issue 37: do speculative and plain decoding part only at near-ties? z3's start eval (its
# committed adapter, z3's setting: 200 test puzzles and the two 200-puzzle held-out sets, each
# its own 200-row call, so verify steps run from the first decode step) once per VARIANT, then
# `python -m benchmarks.near_ties` on every answer that differs from the first variant's.
# One GPU of a device lease, after the countdown-paper lease's setup.sh, the 0.5B's pieces,
# `launch.sh 0 0 - q05 convert` and z3's adapter in /root/z3-adapter
# (docs/results/countdown-paper-split/device/):
#   bash docs/benchmarks/speculate-near-ties.sh 0 4:540
# VARIANT: N (server.speculate=N) or N:R (with server.speculate_rows=R). Each run is stopped
# once its start eval's answers are saved (generation 1 is never run). Records in /root/ties/.
set -u
export EVOLM_CACHE_DIR=/root/evcache EVOLM_COUNTDOWN_JSON=/root/countdown.json PYTHONUNBUFFERED=1
R=/root/ties; mkdir -p "$R"; cd /root/evolm-run
for n in "$@"; do
  case $n in
    *:*) server="server.speculate=${n%%:*} server.speculate_rows=${n##*:}" ;;
    *) server="server.speculate=$n" ;;
  esac
  d=$R/sp${n//:/-r}; rm -rf "$d"
  setsid python3 -m evolm experiment=qwen05_paper_countdown_shots \
    model=qwen2.5-coder-0.5b-instruct model.gguf_file=/root/q05.gguf \
    lora.init_from=/root/z3-adapter logger=none generations=1 task.eval_samples=200 \
    callbacks.samples.count=200 $server hydra.run.dir=$d > $d.log 2>&1 &
  pid=$!
  files="$d/samples/gen-000.jsonl $d/samples/tree_free/gen-000.jsonl $d/samples/uniform_free/gen-000.jsonl"
  while kill -0 $pid 2>/dev/null; do
    ls $files > /dev/null 2>&1 && break
    sleep 1
  done
  kill -- -$pid 2>/dev/null; wait $pid 2>/dev/null
  echo "sp$n: $(grep -c . $files 2>/dev/null | tr '\n' ' ')"
done
model=$(ls -d /root/evcache/models/qwen2.5-coder-0.5b-instruct-* | head -1)
first=sp${1//:/-r}; shift
for n in "$@"; do
  python3 -m benchmarks.near_ties $R/$first $R/sp${n//:/-r} "$model" /root/z3-adapter \
    --json $R/ties-$first-vs-sp${n//:/-r}.json 2>&1 | grep -v Warning
done
[ -n "${OUT:-}" ] && cp $R/*.json $R/*.log "$OUT"/ 2>/dev/null
exit 0
