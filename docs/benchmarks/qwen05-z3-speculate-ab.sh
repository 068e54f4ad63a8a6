#!/bin/bash
# Issue 37's speculation A/B on a run whose tail is long from its first generation: z3's
# setting (experiment=qwen05_paper_countdown_shots, the trained 0.5B of issue 36: 7% of its
# rows run to the 1,024-token budget, 832 of its 1,024 decode steps a generation are tail
# steps) continued from z3's adapter, once per SPECULATE, one after the other, alone on the GPU.
# One GPU of a device lease, after the countdown-paper lease's setup.sh, the 0.5B's pieces in
# /root/p, `launch.sh 0 0 - q05 convert` and z3's adapter in /root/z3-adapter
# (docs/results/countdown-paper-split/device/):
#   bash docs/benchmarks/qwen05-z3-speculate-ab.sh GENERATIONS VARIANT...   e.g. 3 0 4
# VARIANT: a number N (the local engine, server.speculate=N), `sglang` (server=sglang) or
# `sglang-ngram` (server=sglang with SGLang's own n-gram speculation, which takes LoRA adapters
# since sgl-project/sglang#12903: --speculative-algorithm NGRAM; not yet run with evolm). The
# SGLang variants need the GPU bundle extracted to /tmp/site (docs/sglang-gpu.md).
# Each run: the start's eval (the mean's 2,000 test answers saved: compared row by row) and
# GENERATIONS training generations (the same seed: the same members and puzzles, so they
# compare one to one). Prints the comparison; records in /root/specz3/.
set -u
export EVOLM_CACHE_DIR=/root/evcache EVOLM_COUNTDOWN_JSON=/root/countdown.json PYTHONUNBUFFERED=1
R=/root/specz3; mkdir -p "$R"; cd /root/evolm-run
gens=$1; shift
printf '#!/bin/sh\nPYTHONPATH=/tmp/site exec python3 "$@"\n' > /tmp/sgpy && chmod +x /tmp/sgpy
for n in "$@"; do
  case $n in
    sglang) server="server=sglang server.python=/tmp/sgpy" ;;
    sglang-ngram) server="server=sglang server.python=/tmp/sgpy server.extra_args=[--speculative-algorithm,NGRAM]" ;;
    *) server="server.speculate=$n" ;;
  esac
  rm -rf "$R/sp$n"
  python3 -m evolm experiment=qwen05_paper_countdown_shots model=qwen2.5-coder-0.5b-instruct \
    model.gguf_file=/root/q05.gguf lora.init_from=/root/z3-adapter logger=none \
    generations="$gens" eval_every=1000 callbacks.samples.count=2000 $server \
    hydra.run.dir=$R/sp$n > $R/sp$n.log 2>&1
  echo "sp$n: exit $?"
done
python3 - "$R" "$@" <<'PY'
import json, sys
from pathlib import Path
root, ns = Path(sys.argv[1]), sys.argv[2:]
keys = ("time/generation_s", "time/engine_generate_s", "time/engine_tail_s",
        "time/engine_tail_steps", "time/engine_steps", "time/engine_spec_rows",
        "time/engine_spec_kept", "time/eval_s", "train/fitness_mean", "train/completion_tokens")
answers = {}
for n in ns:
    for line in open(root / f"sp{n}" / "results.jsonl"):
        r = json.loads(line)
        print(f"sp{n} gen {r['generation']}:", {k.split('/')[-1]: round(r[k], 5) for k in keys if k in r})
    first = sorted((root / f"sp{n}" / "samples").glob("gen-*.jsonl"))[0]
    answers[n] = [json.loads(l)["completion"] for l in open(first)]
base = answers[ns[0]]
for n in ns[1:]:
    same = sum(a == b for a, b in zip(base, answers[n], strict=True))
    print(f"eval answers identical, sp{ns[0]} vs sp{n}: {same} of {len(base)}")
PY
echo done > $R/DONE
