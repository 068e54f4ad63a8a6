#!/bin/bash
# Pack comparisons (records, logs, answers, figure, final adapters; no checkpoints) into $OUT in
# pieces of <= 15 MB.   bash collect.sh [OUT...]   (default /root/cmp)
for d in "${@:-/root/cmp}"; do
  cp "$d.log" "$d/compare.log" 2>/dev/null
  n=$(basename "$d")
  tar --exclude='*/checkpoints' --exclude='*.pt' --exclude='*/checkpoint-*' -C "$(dirname "$d")" -cf - "$n" \
    | xz -T0 -6 | split -b 15000000 -d - "$OUT/$n.tar.xz.part-"
done
ls -la "$OUT"
