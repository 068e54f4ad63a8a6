#!/bin/bash
# What a run would lose with its machine, sent back through $OUT: bash save.sh NAME...
# One bundle, save.tar.xz.part-NN (<= 15 MB each; the device tool returns files of at most
# 16 MiB, 8 a call): each named run's results.jsonl, config and newest checkpoint (a resume needs
# no more: carry the checkpoint in with the run's .hydra and `launch.sh ... resume`), and every
# finished outside check (/root/runs/*-check.json). collect.sh, at the end, adds the answers.
#   tar -xJf <(cat save.tar.xz.part-*)     (here, to unpack)
cd "${RUNS:-/root/runs}" || exit 0
files=$(ls -d *-check.json 2>/dev/null)
for r in "$@"; do
  ck=$(ls -t $r/checkpoints/*.pt 2>/dev/null | head -1)
  files="$files $(ls -d $r/results.jsonl $r/config.yaml $r/.hydra 2>/dev/null) ${ck:+$ck $ck.sha256}"
done
[ -z "${files// }" ] && exit 0
tar -cf - $files 2>/dev/null | xz -T0 -3 | split -b 15000000 -d - "$OUT/save.tar.xz.part-"
echo "saved: $(du -ch "$OUT"/save.tar.xz.part-* | tail -1 | cut -f1) ($(echo $files | wc -w) paths)"
