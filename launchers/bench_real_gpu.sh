#!/usr/bin/env bash
# W-real on a GPU machine: evolm's continuous batching (and its fp8 options) vs a real SGLang
# server, on the same rows (python -m benchmarks --real; the older wave path was removed). Steps run one after another within
# one time budget, each writing its own JSON under OUT as it goes.
#
#   launchers/bench_real_gpu.sh BUNDLE OUT BUDGET_S STEP...
#     BUNDLE: site.tar.xz from ../shared/tools/sglang-gpu-bundle.sh (+ whl/ for evolm's client)
#     STEP:   check | local:SHAPE:REGIMES[:METHODS] | sglang:SHAPE:REGIMES[:METHODS]
#   e.g. launchers/bench_real_gpu.sh .bundle /tmp/out 570 check \
#          local:qwen2.5-1.5b:variable,fixed sglang:qwen2.5-1.5b:variable
set -uo pipefail
bundle=$1 out=$2 budget=$3; shift 3
end=$(( $(date +%s) + budget ))
left() { echo $(( end - $(date +%s) )); }
if [ ! -x /tmp/site/bin ] && [ ! -d /tmp/site/sglang ]; then
  mkdir -p /tmp/site && (tar -C /tmp/site -xJf "$bundle/site.tar.xz" && touch /tmp/site/.done) &
fi
if ls "$bundle"/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/evsite "$bundle"/whl/*.whl
fi
export PYTHONPATH=$PWD:/tmp/evsite PYTHONUNBUFFERED=1
printf '#!/bin/sh\nPYTHONPATH=/tmp/site exec python3 "$@"\n' > /tmp/sgpy && chmod +x /tmp/sgpy
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/machine.txt"
for step in "$@"; do
  IFS=: read -r kind shape regimes methods <<< "$step"
  t=$(left); [ "$t" -lt 30 ] && { echo "skip $step: ${t}s left"; continue; }
  echo "== $step (${t}s left)"
  case $kind in
    check) timeout "$t" python3 tests/cuda_slots_check.py | tee "$out/check.json" ;;
    local) timeout "$t" python3 -m benchmarks --real --shape "$shape" --regimes "$regimes" \
             --methods "${methods:-continuous,continuous_fp8}" \
             --json "$out/local-$shape-${methods:-both}.json" ;;
    sglang) while [ ! -e /tmp/site/.done ]; do sleep 2; done
            t=$(left); timeout "$t" python3 -m benchmarks --real --shape "$shape" \
             --regimes "$regimes" --methods "${methods:-sglang}" --sglang-python /tmp/sgpy \
             --json "$out/sglang-$shape-${methods:-sglang}.json" ;;
  esac
  echo "== $step rc=$?"
done
