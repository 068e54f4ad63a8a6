#!/bin/bash
# Runs of the 0.5B side by side on one GPU, each capped at 3,000 slots: whichever plans first,
# both fit (~19 MiB a slot at 1,616 positions with task.shots=2). A share of the memory
# (server.gpu_memory_utilization) would not do: a plan subtracts what the other run holds.
#   bash pair.sh SECONDS NAME "overrides" [NAME "overrides" ...]
# After setup.sh, the 8 pieces in /root/p and `bash launch.sh 0 0 - q05 convert`.
# ROWS=N: another cap. With the 4-number examples (task.shots={3:2,4:3}) a training row holds
# 1,856 positions (22 MiB): beside an outside check (17 GB) on an H100 at most 2,226 rows fit, so
# ROWS=2000 (session 26: at 3,000, z6 stopped at its first training generation).
T=$1; shift
d=$(dirname "$0")
while [ $# -ge 2 ]; do
  bash "$d/launch.sh" "$T" 0 "$1" q05 "$2 server.max_batch_rows=${ROWS:-3000}"
  shift 2
done
