"""z5s2: evolm's eval answers vs the outside check's (both bf16, one H100) on the two
template-free sets: where they part, the fp32 reference's gap (benchmarks.near_ties.parting)."""
import json, lzma, re, sys
from dataclasses import asdict
import torch
from benchmarks.near_ties import load_reference, parting
S = "docs/results/countdown-paper-split/session-34"
model, tok = load_reference(sys.argv[1], f"{S}/z5s2-gen053-adapter", torch.float32)
torch.set_num_threads(2)
import tarfile
tf = tarfile.open(f"{S}/z5s2-answers.tar.xz")
out = {}
for name in ("uniform_free", "tree_free"):
    ev = [json.loads(l) for l in tf.extractfile(f"samples/{name}/gen-053.jsonl").read().decode().splitlines()]
    ck = json.loads(lzma.open(f"{S}/z5s2-{name}-outside-check-h100.json.xz").read())["answers"]
    same, parts = 0, []
    for i, (e, c) in enumerate(zip(ev, ck, strict=True)):
        nums = re.findall(r"Using the numbers \[([^\]]*)\], create an equation that equals (\d+)", e["prompt"])[-1]
        assert sorted(map(int, nums[0].split())) == sorted(c["numbers"]) and nums[1] == str(c["target"]), i
        if e["completion"] == c["completion"]:
            same += 1; continue
        try:  # session 34's run: every differing row tokenized back (none unscored)
            p = parting(model, tok, e["prompt"], e["completion"], c["completion"], (name, i))
        except ValueError as err:
            print(name, i, "not scored:", err, flush=True); continue
        if p: parts.append(asdict(p)); print(name, i, p.token, repr(p.a), repr(p.b), round(p.gap_a, 4), round(p.gap_b, 4), p.rank_a, p.rank_b, round(p.margin_pct, 1), round(p.prefix_agrees, 3), int(e["scores"]["accuracy"]), int(c["correct"]), flush=True)
    print(name, "identical", same, "of", len(ev), flush=True)
    out[name] = {"identical": same, "rows": len(ev), "partings": parts}
json.dump(out, open("/tmp/evolm_vs_outside.json", "w"), indent=1)
