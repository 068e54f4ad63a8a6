#!/usr/bin/env bash
# ONE distributed ES run on SLURM: N nodes x K GPUs, one task (ES rank) per GPU (evolm.dist reads
# SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS; rank r uses cuda:SLURM_LOCALID).
#
#   sbatch --nodes=2 --ntasks-per-node=4 --gpus-per-node=4 launchers/slurm_train.sh \
#       experiment=paper_conciseness model=qwen2.5-1.5b-instruct
#
# Resume (any N x K): sbatch ... launchers/slurm_train.sh resume=outputs/runs/<date>/<time>
# Rank 0 writes the run directory, checkpoints, MLflow and the adapter; the others write
# nothing but their log (rank<r>.log). Keep MLflow on a tracking server or a local sqlite file
# of rank 0's node. PYTHON: interpreter with evolm (default: python).
#SBATCH --job-name=evolm
#SBATCH --cpus-per-task=8
#SBATCH --time=04:00:00
set -euo pipefail
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
export MASTER_ADDR
export MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}
exec srun --kill-on-bad-exit=1 "${PYTHON:-python}" -m evolm "$@"
