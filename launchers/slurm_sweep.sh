#!/usr/bin/env bash
# Optuna sweep whose trials are SLURM jobs (conf/hydra/launcher/slurm.yaml). Needs
# `pip install -e '.[slurm]'` (hydra-submitit-launcher 1.2.0; runs under hydra-core 1.4.0rc3).
#
#   launchers/slurm_sweep.sh PARALLEL [overrides...]
#   launchers/slurm_sweep.sh 8 hydra.launcher.partition=gpu hydra.sweeper.n_trials=64
#
# Run it where it can stay up for the whole sweep (tmux on a login node, or a small CPU job):
# this process asks Optuna for PARALLEL trials at a time, submits them as one job array and
# tells Optuna their results. TPE runs with constant_liar so the trials of one batch differ.
# Every trial is its own SLURM job and process, so it loads its model itself: for ONE
# persistent server, start it once as its own job (launchers/sglang_server.sh, with
# MAX_LORA_RANK = the largest rank searched) and pass
#   server=sglang server.url=http://NODE:30000 server.max_lora_rank=8
# Trials on several nodes need stores they can all reach: an MLflow tracking server
# (MLFLOW_TRACKING_URI=http://HOST:5000; `mlflow server --backend-store-uri
# sqlite:///outputs/mlflow.db --host 0.0.0.0`), not a sqlite file on a network filesystem.
#   PYTHON   interpreter with evolm (default: python)
set -euo pipefail
PARALLEL=${1:?usage: $0 PARALLEL [overrides...]}
shift
exec "${PYTHON:-python}" -m evolm -m hparams_search=es_optuna hydra/launcher=slurm \
  hydra.sweeper.n_jobs="$PARALLEL" hydra.sweeper.sampler.constant_liar=true "$@"
