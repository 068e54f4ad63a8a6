#!/bin/bash
# One run in the background on one GPU of an offline device machine (how session 1 ran).
#   bash launch.sh SECONDS GPU NAME q05|q15 "overrides"
#   bash launch.sh SECONDS GPU NAME q05|q15 resume    (continue /root/runs/NAME as configured)
#   bash launch.sh SECONDS GPU NAME q05|q15 "resume time_budget_s=2400"   (with a new time budget)
# Expects /root/p/<model>.part-* (the model's GGUF in pieces, as carried), /root/countdown.json,
# and the wheelhouse installed. The run stops itself after SECONDS with SIGTERM (evolm
# checkpoints its last generation and exits 143); `resume=/root/runs/NAME` continues it.
# SECONDS counts from the call: the GGUF's first conversion (~95 s at 0.5B before session 13's
# one-parse change, 2.2x faster on the CPU since) comes out of it, so
# convert first (`bash launch.sh 0 0 - q05 convert`), then compute time_budget_s and launch.
set -u
t0=$(date +%s)
export EVOLM_CACHE_DIR=/root/evcache EVOLM_COUNTDOWN_JSON=/root/countdown.json PYTHONUNBUFFERED=1
T=$1; gpu=$2; name=$3; m=$4; over=$5
[ -f /root/$m.gguf ] || cat /root/p/$m.part-* > /root/$m.gguf
if [ ! -d /root/evolm-run ]; then  # a frozen copy: later calls may change the sent tree
  mkdir -p /root/evolm-run && tar --exclude=./.carry --exclude=./.git -cf - . | tar -xf - -C /root/evolm-run
fi
cd /root/evolm-run
if [ "$m" = q05 ]; then model=qwen2.5-coder-0.5b-instruct; else model=qwen2.5-coder-1.5b-instruct; fi
if [ ! -f /root/$m.converted ]; then  # convert once, before runs start side by side
  python3 -c "from evolm.model import GGUFModel; print(GGUFModel(name='$model', gguf_file='/root/$m.gguf').resolve())" 2>&1 | tail -1
  touch /root/$m.converted
fi
[ "$over" = convert ] && exit 0
T=$(( T - ($(date +%s) - t0) ))  # session 10's f05 outlived its lease by the conversion
mkdir -p /root/runs
if [ "${over%% *}" = resume ]; then  # a resume may change only time_budget_s, eval_every(_s)
  args="resume=/root/runs/$name ${over#resume}"
  [ -f /root/runs/$name.log ] && mv /root/runs/$name.log /root/runs/$name.$(date +%s).log
else
  exp=experiment=qwen05_paper_countdown  # unless the overrides name their own experiment
  case " $over " in *" experiment="*) exp= ;; esac
  args="$exp model=$model model.gguf_file=/root/$m.gguf logger=none hydra.run.dir=/root/runs/$name $over"
fi
CUDA_VISIBLE_DEVICES=$gpu setsid nohup timeout -s TERM "$T" python3 -m evolm $args \
  > /root/runs/$name.log 2>&1 < /dev/null &
echo "launched $name on GPU $gpu ($model): $over"
