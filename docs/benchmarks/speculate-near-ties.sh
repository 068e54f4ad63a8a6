#!/bin/bash
# Issue 37: do speculative and plain decoding part only at near-ties? z3's setting from its
# committed adapter, one generation, once per VARIANT: two evals (the start's and generation
# 1's), each of 200 test puzzles and the two 200-puzzle held-out sets, every set its own
# 200-row call (verify steps from the first decode step); then `python -m benchmarks.near_ties`
# at both evals on every answer that differs from the first variant's, against the adapter the
# first variant evaluated (the start: z3's; generation 1: its adapter/, checked equal to each
# other variant's).
# One GPU of a device lease, after the countdown-paper lease's setup.sh, the 0.5B's pieces,
# `launch.sh 0 0 - q05 convert` and z3's adapter in /root/z3-adapter
# (docs/results/countdown-paper-split/device/):
#   bash docs/benchmarks/speculate-near-ties.sh 0 4:540
# VARIANT: N (server.speculate=N) or N:R (with server.speculate_rows=R). ~60 s a variant on an
# H100 (session 34), then ~1 s a differing answer. Records in /root/ties/ and, in a device call,
# $OUT (the checks' JSON, the logs, and every variant's answers in answers.tar.xz).
set -u -o pipefail
[ $# -ge 2 ] || { echo "usage: $0 VARIANT VARIANT... (e.g. 0 4:540)" >&2; exit 2; }
export EVOLM_CACHE_DIR=/root/evcache EVOLM_COUNTDOWN_JSON=/root/countdown.json PYTHONUNBUFFERED=1
R=/root/ties; mkdir -p "$R"; cd /root/evolm-run
status=0
for n in "$@"; do
  case $n in
    *:*) server="server.speculate=${n%%:*} server.speculate_rows=${n##*:}" ;;
    *) server="server.speculate=$n" ;;
  esac
  d=$R/sp${n//:/-r}; rm -rf "$d"
  python3 -m evolm experiment=qwen05_paper_countdown_shots \
    model=qwen2.5-coder-0.5b-instruct model.gguf_file=/root/q05.gguf \
    lora.init_from=/root/z3-adapter logger=none generations=1 task.eval_samples=200 \
    callbacks.samples.count=200 callbacks.samples.token_ids=true $server \
    hydra.run.dir=$d > $d.log 2>&1
  rc=$?; [ $rc = 0 ] || status=1
  echo "sp$n: exit $rc ($(grep -o 'generation 1/1: .*' $d.log | cut -c1-120))"
done
first=sp${1//:/-r}; shift
# the model directory the first run loaded, as its log names it
model=$(grep -o 'loaded /[^ ]* on ' $R/$first.log | head -1 | cut -d' ' -f2)
for n in "$@"; do
  b=sp${n//:/-r}
  if cmp -s $R/$first/adapter/adapter_model.safetensors $R/$b/adapter/adapter_model.safetensors
  then echo "$b: generation 1's adapter equal to $first's"
  else echo "$b: generation 1's adapter DIFFERS from $first's (its gen-1 check is not exact)"
  fi
  for gen in 0 1; do
    adapter=/root/z3-adapter; [ $gen = 1 ] && adapter=$R/$first/adapter
    python3 -m benchmarks.near_ties $R/$first $R/$b "$model" $adapter --gen $gen \
      --json $R/ties-$first-vs-$b-gen$gen.json 2>&1 | grep -v -i warn || status=1
  done
done
if [ -n "${OUT:-}" ]; then
  cp $R/*.json $R/*.log "$OUT"/ 2>/dev/null
  (cd $R && tar -cJf "$OUT/answers.tar.xz" sp*/samples)
fi
exit $status
