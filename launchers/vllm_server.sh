#!/usr/bin/env bash
# Start a vLLM OpenAI server with the flags evolm needs (runtime LoRA loading), in the foreground.
# Then: python -m evolm server=vllm server.url=http://$HOST:$PORT ...
#
#   MODEL          model directory or hub id (required)
#   PORT           default 8000;  HOST default 127.0.0.1
#   MAX_LORA_RANK  one of 1 8 16 32 64 128 256 320 512, >= lora.rank (default 8)
#   MAX_LORAS      adapters per batch, ~population size (default 32)
#   MAX_MODEL_LEN  default 4096;  DTYPE default auto (float32 on CPU for exact tests)
#   PYTHON         interpreter with vllm (default python3; on CPU: .venv-vllm/bin/python,
#                  see launchers/setup_vllm_cpu.sh)
#   extra arguments are passed on, e.g. --kv-cache-memory-bytes 1073741824 on a small CPU box
set -euo pipefail
: "${MODEL:?set MODEL to a model directory or hub id}"
export VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
exec "${PYTHON:-python3}" -m vllm.entrypoints.openai.api_server \
  --model "$MODEL" \
  --host "${HOST:-127.0.0.1}" --port "${PORT:-8000}" \
  --enable-lora \
  --max-lora-rank "${MAX_LORA_RANK:-8}" \
  --max-loras "${MAX_LORAS:-32}" \
  --max-model-len "${MAX_MODEL_LEN:-4096}" \
  --dtype "${DTYPE:-auto}" \
  "$@"
