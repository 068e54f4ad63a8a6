#!/bin/bash
# Issue 37's speculation A/B on a run whose tail is long from its first generation: z3's
# setting (experiment=qwen05_paper_countdown_shots, the trained 0.5B of issue 36: 7% of its
# rows run to the 1,024-token budget, 832 of its 1,024 decode steps a generation are tail
# steps) continued from z3's adapter, once per SPECULATE, one after the other, alone on the GPU.
# One GPU of a device lease, after the countdown-paper lease's setup.sh, the 0.5B's pieces in
# /root/p, `launch.sh 0 0 - q05 convert` and z3's adapter in /root/z3-adapter
# (docs/results/countdown-paper-split/device/):
#   bash docs/benchmarks/qwen05-z3-speculate-ab.sh GENERATIONS VARIANT...   e.g. 3 0 4
#   AB_OVERRIDES="eval_start=false" bash ... 5 0 4   (more overrides for every variant; session
#   31's: no start eval, so 5 generations fit beside the final eval)
#   AB_ADAPTER=/root/z5s2-adapter bash ... 2 0 share   (another adapter than z3's)
# VARIANT: a number N (the local engine, server.speculate=N), N:R (the same with
# server.speculate_rows=R: verify steps once at most R rows run), `share` (server.share_prefix:
# a member's rows copy their shared prompt prefix's K/V, engine/fast/prefix.py), `sglang`
# (server=sglang) or
# `sglang-ngram` (server=sglang with SGLang's own n-gram speculation, which takes LoRA adapters
# since sgl-project/sglang#12903: --speculative-algorithm NGRAM; not yet run with evolm). The
# SGLang variants need the GPU bundle extracted to /tmp/site (docs/sglang-gpu.md).
# Each run: the start's and the last eval (the mean's 2,000 test answers and each held-out
# set's 200 saved: compared row by row) and GENERATIONS training generations (the same seed:
# the same members and puzzles, so they compare one to one). Prints the comparison; records
# in /root/specz3/.
set -u
export EVOLM_CACHE_DIR=/root/evcache EVOLM_COUNTDOWN_JSON=/root/countdown.json PYTHONUNBUFFERED=1
R=/root/specz3; mkdir -p "$R"; cd /root/evolm-run
gens=$1; shift
printf '#!/bin/sh\nPYTHONPATH=/tmp/site exec python3 "$@"\n' > /tmp/sgpy && chmod +x /tmp/sgpy
for n in "$@"; do
  case $n in
    sglang) server="server=sglang server.python=/tmp/sgpy" ;;
    sglang-ngram) server="server=sglang server.python=/tmp/sgpy server.extra_args=[--speculative-algorithm,NGRAM]" ;;
    share) server="server.share_prefix=true" ;;
    *:*) server="server.speculate=${n%%:*} server.speculate_rows=${n##*:}" ;;
    *) server="server.speculate=$n" ;;
  esac
  d=sp${n//:/-r}  # sp4-r540 for 4:540
  rm -rf "$R/$d"
  python3 -m evolm experiment=qwen05_paper_countdown_shots model=qwen2.5-coder-0.5b-instruct \
    model.gguf_file=/root/q05.gguf lora.init_from=${AB_ADAPTER:-/root/z3-adapter} logger=none \
    generations="$gens" eval_every=1000 callbacks.samples.count=2000 $server ${AB_OVERRIDES:-} \
    hydra.run.dir=$R/$d > $R/$d.log 2>&1
  echo "$d: exit $?"
done
python3 - "$R" "$@" <<'PY'
import json, sys
from pathlib import Path
root, ns = Path(sys.argv[1]), sys.argv[2:]
keys = ("time/generation_s", "time/engine_generate_s", "time/engine_prefill_s",
        "time/engine_prefix_copied", "time/engine_tail_s",
        "time/engine_tail_steps", "time/engine_steps", "time/engine_spec_rows",
        "time/engine_spec_kept", "time/eval_s", "train/fitness_mean", "train/completion_tokens")
answers = {}
for n in ns:
    d = "sp" + n.replace(":", "-r")
    for line in open(root / d / "results.jsonl"):
        r = json.loads(line)
        print(f"{d} gen {r['generation']}:", {k.split('/')[-1]: round(r[k], 5) for k in keys if k in r})
    samples = root / d / "samples"  # the test set's, and each held-out set's in <name>/
    answers[n] = {str(f.relative_to(samples)): [json.loads(l)["completion"] for l in open(f)]
                  for f in sorted(samples.rglob("gen-*.jsonl"))}
base = answers[ns[0]]
for n in ns[1:]:
    for name, rows in base.items():  # each evaluation's answers, row by row
        same = sum(a == b for a, b in zip(rows, answers[n][name], strict=True))
        print(f"eval answers identical ({name}), sp{ns[0]} vs sp{n}: {same} of {len(rows)}")
PY
echo done > $R/DONE
