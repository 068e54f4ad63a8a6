#!/bin/bash
# Pack the comparison (records, logs, answers, figure, final adapters; no checkpoints) into $OUT
# in pieces of <= 15 MB.   bash collect.sh
cd /root && cp cmp.log cmp/compare.log 2>/dev/null
tar --exclude='*/checkpoints' --exclude='*.pt' --exclude='*/checkpoint-*' -cf - cmp \
  | xz -T0 -6 | split -b 15000000 -d - $OUT/cmp.tar.xz.part-
ls -la $OUT
