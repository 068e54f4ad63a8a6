#!/usr/bin/env bash
# Start an SGLang server (GPU) with the flags evolm needs (dynamic LoRA loading), in the foreground.
# Then: python -m evolm server=sglang server.url=http://$HOST:$PORT ...
#
#   MODEL                model directory or hub id (required)
#   PORT                 default 30000;  HOST default 127.0.0.1
#   MAX_LORA_RANK        >= lora.rank; fixed for the server's life, so the largest rank of a
#                        sweep (default 8)
#   LORA_TARGET_MODULES  space-separated, must include lora.target_modules
#                        (default: all seven projections)
#   MAX_LORAS_PER_BATCH  adapter slots; >= population size + 2 (the base model takes one, the
#                        mean's adapter one: train_mean=true) runs a generation in one batch
#                        (default 32: population 30)
#   CUDA_DEVICES         CUDA_VISIBLE_DEVICES (default: inherited)
#   DTYPE                default auto
#   PYTHON               interpreter with sglang (default python3)
#   MODULE               default sglang.launch_server; evolm.testing.sglang_standin runs the CPU
#                        stand-in (tests, demos without a GPU)
#   extra arguments are passed on, e.g. --mem-fraction-static 0.8 --enable-deterministic-inference
set -euo pipefail
: "${MODEL:?set MODEL to a model directory or hub id}"
if [[ -n "${CUDA_DEVICES:-}" ]]; then export CUDA_VISIBLE_DEVICES="$CUDA_DEVICES"; fi
# shellcheck disable=SC2086  # LORA_TARGET_MODULES is a space-separated list
exec "${PYTHON:-python3}" -m "${MODULE:-sglang.launch_server}" \
  --model-path "$MODEL" \
  --host "${HOST:-127.0.0.1}" --port "${PORT:-30000}" \
  --enable-lora \
  --max-lora-rank "${MAX_LORA_RANK:-8}" \
  --lora-target-modules ${LORA_TARGET_MODULES:-q_proj k_proj v_proj o_proj gate_proj up_proj down_proj} \
  --max-loras-per-batch "${MAX_LORAS_PER_BATCH:-32}" \
  --dtype "${DTYPE:-auto}" \
  --attention-backend triton --sampling-backend pytorch \
  "$@"
