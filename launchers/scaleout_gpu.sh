#!/usr/bin/env bash
# Scale-out on one GPU node through the real CLI (`python -m evolm` on 1 GPU, `torchrun
# --nproc_per_node=K -m evolm` on K): the same run, the same rows; per-generation times from
# each run's results.jsonl (`time/generation_s`, `time/comm_s`). Steps run one after another
# within one time budget; each copies its results.jsonl to OUT as it ends.
#
#   launchers/scaleout_gpu.sh OUT BUDGET_S STEP...
#     STEP: local:MODEL:K | sglang:MODEL:K     (K GPUs; K=1 runs plain python on GPU 0)
#     MODEL: random15 (random-weight Qwen2.5-1.5B shape: nearly every row runs to 1,024 tokens,
#            the fixed regime) | qwen05 (Qwen2.5-Coder-0.5B, GGUF at $QWEN05_GGUF: countdown
#            completions of uneven length, the variable regime)
#   EXTRA: more overrides for every step (e.g. task.samples_per_generation=50); GENS: generations (3)
#   e.g. launchers/scaleout_gpu.sh /tmp/out 560 local:random15:1 local:random15:4
# Needs hydra & co. as wheels in .whl on an offline GPU image (docs/offline.md).
set -uo pipefail
out=$1 budget=$2; shift 2
end=$(( $(date +%s) + budget ))
left() { echo $(( end - $(date +%s) )); }
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -e /tmp/evsite/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/evsite .whl/*.whl \
    && touch /tmp/evsite/.done
fi
export PYTHONPATH=$PWD:/tmp/evsite PYTHONUNBUFFERED=1 EVOLM_CACHE_DIR=${EVOLM_CACHE_DIR:-/tmp/evcache}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/machine.txt"
random15="model=tiny model.hidden_size=1536 model.num_layers=28 model.num_heads=12
  model.num_kv_heads=2 model.intermediate_size=8960 model.vocab_size=151936 model.warmup_steps=0
  model.countdown_share=0 model.countdown_untagged=0 model.max_position_embeddings=2048"
qwen05="model=qwen2.5-coder-0.5b-instruct model.gguf_file=${QWEN05_GGUF:-/root/q05.gguf}"
common="task=countdown task.samples_per_generation=200 task.eval_samples=8
  task.max_new_tokens=1024 es.population_size=30 es.sigma=0.002 generations=${GENS:-3}
  eval_every=1000 logger=none callbacks.checkpoint.every=1000 ${EXTRA:-}"
for step in "$@"; do
  IFS=: read -r kind model k <<< "$step"
  t=$(left); [ "$t" -lt 30 ] && { echo "skip $step: ${t}s left"; continue; }
  echo "== $step (${t}s left)"
  run=/tmp/runs/$kind-$model-x$k; rm -rf "$run"
  devs=$(seq -s, 0 $((k - 1)))
  extra=""
  [ "$kind" = sglang ] && extra="server=sglang server.python=/tmp/sgpy server.cuda_devices=[$devs] server.max_loras_per_batch=31"
  if [ "$k" = 1 ] || [ "$kind" = sglang ]; then
    launch=(env CUDA_VISIBLE_DEVICES=$devs python3 -m evolm)
  else
    launch=(env CUDA_VISIBLE_DEVICES=$devs python3 -m torch.distributed.run --nproc_per_node="$k" -m evolm)
  fi
  timeout "$t" "${launch[@]}" ${!model} $common $extra hydra.run.dir="$run" \
    > "$out/$kind-$model-x$k.log" 2>&1
  echo "== $step rc=$?"; tail -3 "$out/$kind-$model-x$k.log"
  cp "$run/results.jsonl" "$out/$kind-$model-x$k.jsonl" 2>/dev/null
  python3 - "$run/results.jsonl" <<'PY' || true
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "time/generation_s" in r:
        print(r["generation"], {k: round(v, 3) for k, v in r.items() if k.startswith("time/")},
              "tokens", r.get("train/completion_tokens"))
PY
done
