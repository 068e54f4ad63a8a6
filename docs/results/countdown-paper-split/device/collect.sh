#!/bin/bash
# Pack each run's records, answers, newest checkpoint and log into $OUT in pieces of <= 15 MB
# (the device tool returns files of at most 16 MiB, 8 files a call).  bash collect.sh [NAME...]
cd /root/runs
for r in ${@:-$(ls -d */ | tr -d /)}; do
  ck=$(ls -t $r/checkpoints/*.pt 2>/dev/null | head -1)
  cp $r.log $r/run.log 2>/dev/null
  files="$r/results.jsonl $r/config.yaml $r/.hydra $r/samples $r/run.log"
  [ -n "$ck" ] && files="$files $ck $ck.sha256"
  [ -d $r/adapter ] && files="$files $r/adapter"
  tar -cf - $files 2>/dev/null | xz -T0 -6 | split -b 15000000 -d - $OUT/$r.tar.xz.part-
done
ls -la $OUT
