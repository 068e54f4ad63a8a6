#!/bin/bash
# Keep the lease busy and show the comparison's progress: bash peek.sh SECONDS
sleep "$1"; cd /root/cmp 2>/dev/null || { tail -5 /root/cmp.log; exit 0; }
tail -n 3 /root/cmp.log
for m in es grpo; do echo "== $m"; grep -h -E "generation|step|Error|error|WARN|Traceback" $m.log 2>/dev/null | tail -n 2 | cut -c1-240; done
nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader
for m in es grpo; do cat $m/results.jsonl 2>/dev/null | python3 -c "
import json,sys
keys=('accuracy_mean','accuracy_beyond_shortcuts','tree_free/accuracy_mean','uniform_free/accuracy_mean','completion_tokens')
for l in sys.stdin:
    d=json.loads(l)
    if 'eval/accuracy_mean' in d: print('$m', d.get('generation'), round(d.get('time/train_s',0)), {k:round(d['eval/'+k],4) for k in keys if 'eval/'+k in d})"; done
