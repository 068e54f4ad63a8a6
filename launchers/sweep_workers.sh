#!/usr/bin/env bash
# Parallel Optuna sweep on one machine: N worker processes share ONE study (same storage and
# study_name), each running TRIALS trials one after another, each with its own engine (the
# model loads once per worker; with server=sglang|vllm and server.url=..., all workers attach
# to one running server instead).
#
#   launchers/sweep_workers.sh N TRIALS [overrides...]
#   launchers/sweep_workers.sh 4 10 hydra.sweeper.study_name=big server=sglang \
#       server.url=http://127.0.0.1:30000 server.max_lora_rank=8
#
# K GPUs: GPUS=0,1,2,3 gives worker i the GPU GPUS[i mod K] alone (CUDA_VISIBLE_DEVICES), so
# N=K runs K trials at once, one per GPU, each loading its model once on its GPU:
#   GPUS=0,1,2,3 launchers/sweep_workers.sh 4 10 model=qwen2.5-1.5b-instruct
# (a distributed trial instead, several GPUs per trial: hydra/launcher=slurm with
# hydra.launcher.gpus_per_node=K, docs/distributed.md.)
#
# Worker i runs with EVOLM_SWEEP_WORKER=i (its sampler seed differs: no two workers draw the
# same start-up points) and its own sweep dir outputs/multiruns/<stamp>/worker<i>, its output
# in worker<i>.out there. Exits non-zero if any worker failed.
#   PYTHON     interpreter with evolm (default: python)
#   STAGGER_S  seconds between worker starts (default: 2; 0 is safe too)
#   GPUS       comma-separated GPU ids to spread the workers over (default: inherited devices)
#   ROOT       the folder of the workers' sweep dirs (default: outputs/multiruns/<stamp>)
set -euo pipefail
N=${1:?usage: $0 N TRIALS [overrides...]}
TRIALS=${2:?usage: $0 N TRIALS [overrides...]}
shift 2
ROOT=${ROOT:-outputs/multiruns/$(date +%Y-%m-%d/%H-%M-%S)}
mkdir -p "$ROOT"
IFS=, read -r -a gpus <<<"${GPUS:-}"
pids=()
for ((i = 0; i < N; i++)); do
  (
    if ((${#gpus[@]})); then
      export CUDA_VISIBLE_DEVICES=${gpus[i % ${#gpus[@]}]}
    fi
    echo "worker $i: CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<inherited>}"
    EVOLM_SWEEP_WORKER=$i exec "${PYTHON:-python}" -m evolm -m hparams_search=es_optuna \
      hydra.sweeper.n_trials="$TRIALS" hydra.sweep.dir="$ROOT/worker$i" "$@"
  ) >"$ROOT/worker$i.out" 2>&1 &
  pids+=($!)
  # Workers may start at once: evolm creates a fresh store's tables under a file lock and every
  # worker finds the one MLflow parent; a short stagger only spreads the model loads.
  sleep "${STAGGER_S:-2}"
done
echo "$N workers, $TRIALS trials each: logs in $ROOT/worker*.out"
failed=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "worker $i failed: see $ROOT/worker$i.out" >&2
    failed=1
  fi
done
exit "$failed"
