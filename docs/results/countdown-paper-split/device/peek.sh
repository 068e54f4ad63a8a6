#!/bin/bash
# Keep the lease busy and show where the runs are: bash peek.sh SECONDS NAME...
# (the machine is given back after 30 idle seconds, and what it holds is lost: chain the calls)
# Sleeps SECONDS, or less: it returns once none of the named runs is alive.
# Then, where $OUT is set (every device call), it sends back what a machine taken back would lose
# (session 28 lost a 1.5B run and three outside checks so): save.sh's bundle of the named runs.
here=$(cd "$(dirname "$0")" && pwd)
end=$(( $(date +%s) + $1 )); shift; cd /root/runs
while [ "$(date +%s)" -lt $end ]; do
  alive=0; for r in "$@"; do pgrep -f "hydra.run.dir=/root/runs/$r( |\$)" > /dev/null && alive=1; done
  [ $alive = 0 ] && break; sleep 5
done
for r in "$@"; do echo "== $r"; grep -h -E "generation|Error|error|WARN" $r.log 2>/dev/null | tail -n 2 | cut -c25-300; done
nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader
for r in "$@"; do grep -h '"eval/accuracy_mean"' $r/results.jsonl 2>/dev/null | python3 -c "
import json,sys
keys=('accuracy_mean','accuracy_lift','blind_accuracy','accuracy_beyond_shortcuts','accuracy/no_rule','accuracy/n3','accuracy/n4','completion_tokens','tree_free/accuracy_mean','uniform_free/accuracy_mean')
for l in sys.stdin:
    d=json.loads(l); print('$r', d['generation'], {k:round(d['eval/'+k],3) for k in keys if 'eval/'+k in d})"; done
for r in "$@"; do tail -n 1 $r/results.jsonl 2>/dev/null | python3 -c "
import json,sys
keys=('accuracy_mean','accuracy_lift','pass_at_population','accuracy_beyond_shortcuts','accuracy/no_rule','completion_tokens','truncated_share','mean/accuracy','mean/reward','member_gap','member_gap_se')
for l in sys.stdin:
    d=json.loads(l); print('$r train', d['generation'], round(d.get('time/train_s',0)), round(d.get('time/generation_s',0),1), {k:round(d['train/'+k],3) for k in keys if 'train/'+k in d})"; done
[ -n "${OUT:-}" ] && bash "$here/save.sh" "$@"
