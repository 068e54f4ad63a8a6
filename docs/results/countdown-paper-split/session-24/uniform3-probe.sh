#!/bin/bash
# Session 24, on the CPU: a 0.5B adapter on the 33 3-number puzzles of the uniform-target
# template-free held-out set (experiment=qwen05_paper_countdown's extra_evals.uniform_free:
# evolm's own generated puzzles, not the paper's), greedy, task.shots=2 (z3's prompt), 1,024
# tokens, as the run's eval asks them. ~9-10 min each on the developers' 2-core machine.
#   bash uniform3-probe.sh NAME ADAPTER [GENERATOR]
# GENERATOR: uniform (the default) or tree (extra_evals.tree_free's 3-number puzzles, session 25),
# or paper:N (the first N 3-number puzzles of the paper's 2,000 test puzzles, from
# ../shared/data/countdown/countdown.json beside the checkout or $EVOLM_COUNTDOWN_JSON; strip
# the answers with puzzles.py before committing them). ~28 min for the tree's 112 puzzles.
set -e
NAME=$1; ADAPTER=$2; GEN=${3:-uniform}
FILE=${TMPDIR:-/tmp}/${GEN/:/-}-3.json
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${EVOLM_COUNTDOWN_JSON:-$HERE/../../../../../shared/data/countdown/countdown.json}
python3 - "$FILE" "$GEN" "$DATA" "$HERE/.." <<'PY'
import json, sys
sys.path.insert(0, sys.argv[4])
from heldout_sets import records  # the experiment's held-out sets
gen = sys.argv[2]
if gen.startswith("paper:"):
    test = json.load(open(sys.argv[3]))[-2000:]
    three = [{"numbers": r["numbers"], "target": str(r["target"])} for r in test
             if len(r["numbers"]) == 3][: int(gen.split(":")[1])]
else:
    three = [{"numbers": r["numbers"], "target": r["target"]} for r in records(f"{gen}_free")
             if len(r["numbers"]) == 3]
json.dump([{"numbers": [1, 2, 3], "target": "6"}] + three, open(sys.argv[1], "w"))  # 1 to train
PY
N=$(python3 -c "import json, sys; print(len(json.load(open(sys.argv[1]))) - 1)" "$FILE")
python -m evolm task=countdown model=qwen2.5-coder-0.5b-instruct \
  task.data_file="$FILE" task.train_size=1 task.chat_template=true \
  task.shots=2 task.max_new_tokens=1024 task.eval_samples=$N \
  'task.stop=["</answer>"]' task.format_weight=0 task.samples_per_generation=1 \
  es.population_size=2 es.sigma=0.0005 es.alpha=1e-30 generations=1 eval_start=false \
  eval_every=1000 train_mean=false server.threads=null logger=none callbacks.samples.count=$N \
  lora.init_from="$ADAPTER" hydra.run.dir="outputs/${GEN/:/-}3-probe/$NAME"
