"""GPU check of continuous batching (run on a CUDA machine; prints one JSON line).

- fp32 tiny model, Triton kernels, CUDA graphs per bucket: continuous batching with forced
  refills, mixed budgets and shuffled members gives exactly the one-batch tokens (every row
  in its own slot, member-major);
- bf16 Qwen2.5-1.5B shape: the share of tokens equal between the two paths (bf16 greedy
  depends on batch composition, so not all);
- the planner: a utilization too small for one row raises the ConfigError, not a CUDA OOM.
"""

from __future__ import annotations

import json

import torch

from benchmarks.harness import from_model, generate_ids, with_options
from benchmarks.methods import Workload, sample_population
from benchmarks.shapes import build_model
from evolm.errors import ConfigError
from evolm.lora import LoraLayout, LoraPopulation, LoraSpec
from evolm.sampling import Sampling

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def compare(shape: str, dtype: torch.dtype, members: int, prompts: int, new: int) -> float:
    dev = DEV
    model = build_model(shape, dev, dtype, seed=1)
    layout = LoraLayout.from_hf_config(model.config, LoraSpec(rank=4))
    engine = from_model(model, layout, fast=True)
    work = Workload(shape=shape, members=members, prompts=prompts, sigma=0.05)
    pop, _ = sample_population(work, engine)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    ids = torch.randint(10, vocab, (prompts, 24), generator=gen).repeat(members, 1).to(dev)
    mask = torch.ones_like(ids)
    mask[::3, :5] = 0  # left padding on some rows
    rows = ids.shape[0]
    sampling = Sampling(max_new_tokens=new)
    ref = generate_ids(engine, ids, mask, pop, sampling, eos_ids=[])  # one batch
    assert engine.last_timings["slots"] == rows and engine.last_timings["prefills"] == 1
    capped = with_options(engine, max_batch_rows=rows // 3)
    member = torch.arange(members, device=dev).repeat_interleave(prompts)
    budgets = [int(b) for b in torch.randint(1, new + 1, (rows,), generator=gen)]
    budgets[0] = new
    perm = torch.randperm(rows, generator=gen).to(dev)
    got = torch.empty_like(ref)
    out = generate_ids(
        capped, ids[perm], mask[perm], pop, sampling, member=member[perm],
        budgets=[budgets[i] for i in perm.tolist()], eos_ids=[],
    )  # fmt: skip
    got[perm] = out
    same = total = 0
    for i in range(rows):
        a, b = got[i, : budgets[i]], ref[i, : budgets[i]]
        same += int((a == b).sum())
        total += budgets[i]
        assert bool((got[i, budgets[i] :] == engine.texts.pad_id).all())
    return same / total


def planner_error() -> str:
    dev = torch.device("cuda")
    model = build_model("qwen2.5-1.5b", dev, torch.bfloat16, seed=1)
    layout = LoraLayout.from_hf_config(model.config, LoraSpec(rank=4))
    engine = from_model(model, layout, fast=True, gpu_memory_utilization=0.03)
    pop = LoraPopulation(layout, tuple(torch.zeros(2, *s, device=dev) for s in layout.shapes()))
    ids = torch.ones(4, 128, dtype=torch.long, device=dev)
    try:
        generate_ids(engine, ids, torch.ones_like(ids), pop, Sampling(max_new_tokens=1024))
    except ConfigError as e:
        return str(e)
    return "no error"


def main() -> None:
    out = {
        "tiny_fp32_equal": compare("tiny", torch.float32, 4, 12, 20),
        "qwen1.5b_bf16_equal": compare("qwen2.5-1.5b", torch.bfloat16, 3, 16, 32),
        "planner_error": planner_error(),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
