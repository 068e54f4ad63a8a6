#!/bin/bash
# Keep the lease busy and show the comparisons' progress: bash peek.sh SECONDS [OUT...]
# (default /root/cmp; the machine is given back after 30 idle seconds: chain the calls)
sleep "$1"; shift
for d in "${@:-/root/cmp}"; do
  echo "#### $d"; tail -n 2 "$d.log" 2>/dev/null | cut -c1-240; cd "$d" 2>/dev/null || continue
  for m in es grpo; do [ -f $m.log ] || continue; echo "== $m"
    grep -h -E "generation|step|Error|error|WARN|Traceback" $m.log | tail -n 2 | cut -c1-240; done
  for m in es grpo; do cat $m/results.jsonl 2>/dev/null | python3 -c "
import json,sys
keys=('accuracy_mean','accuracy_beyond_shortcuts','tree_free/accuracy_mean','uniform_free/accuracy_mean','completion_tokens')
for l in sys.stdin:
    d=json.loads(l)
    if 'eval/accuracy_mean' in d: print('$m', d.get('generation'), round(d.get('time/train_s',0)), {k:round(d['eval/'+k],4) for k in keys if 'eval/'+k in d})"; done
done
nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader
