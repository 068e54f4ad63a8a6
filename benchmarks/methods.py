"""The timed methods: one population evaluation (N members x P prompts, forced new tokens).

- ``evolm``: evolm's local engine, all N*P rows in one batched generation with N adapters;
- ``base``: the same engine and batch with no adapters (the LoRA overhead's reference);
- ``paper``: the paper's method, per member: perturb every weight in place from the member's
  seed (``sigma * randn`` per tensor), HF ``generate`` of its P prompts, restore by subtracting
  the regenerated noise;
- ``paper_fast``: the same, generating with evolm's engine (base model) instead of HF;
- ``hf_lora``: one HF ``generate`` per member with that member's single LoRA;
- ``external``: any :data:`Runner` (e.g. evolm's SGLang engine, see
  :func:`benchmarks.external.sglang_runner`) given the same prompts and population.

The per-member baselines run ``k`` members and scale by ``N / k`` (every member's work is the
same shape); the result records ``members_timed``.

The engine's methods use its public API only. The reference baselines (``paper``, ``hf_lora``,
:func:`hf_forced_logits`) run the HF modules themselves, so they use the HF path's adapter
wrappers (:mod:`evolm.engine.hf.multilora`: ``detached``, ``load_population``) on the engine's
``model`` and ``layers``, reading them, never setting engine fields.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from benchmarks.harness import generate_ids
from evolm.engine.hf.multilora import detached, load_population
from evolm.engine.local import LocalEngine
from evolm.es import ES
from evolm.es.noise import mix_seed
from evolm.lora import LoraPopulation, save_adapter
from evolm.sampling import Sampling


@dataclass(frozen=True)
class Workload:
    """One population evaluation's shape."""

    shape: str = "tiny"
    members: int = 30
    prompts: int = 32
    prompt_len: int = 64
    new_tokens: int = 128
    rank: int = 4
    dtype: str = "bfloat16"
    sigma: float = 1e-3
    seed: int = 0

    @property
    def rows(self) -> int:
        return self.members * self.prompts

    @property
    def total_new_tokens(self) -> int:
        return self.rows * self.new_tokens


@dataclass
class Timing:
    """Seconds per population evaluation (median of reps), generated tokens, and extras."""

    seconds: float
    tokens: int
    reps: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "tokens": self.tokens,
            "tokens_per_s": self.tokens / self.seconds if self.seconds else float("nan"),
            "reps": self.reps,
            **self.extra,
        }


Runner = Callable[[Workload, Tensor, LoraPopulation], dict[str, Any]]
"""An external method: ``(workload, prompt ids [P, L], population) -> {"tokens": int, ...}``.
It runs one population evaluation; the caller times it."""


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn: Callable[[], Any]) -> tuple[float, Any]:
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - start, out


def sample_population(
    work: Workload, engine: LocalEngine, state_seed: int = 0, reps: int = 3
) -> tuple[LoraPopulation, dict[str, float]]:
    """ES ask + sample on the engine's device (in its dtype), a tell with random fitness, and
    the engine's copy of the population into its grouped adapter buffers: the bookkeeping a
    generation adds around the evaluation (the load is also inside every ``evolm`` timing).

    Each is timed as the loop runs it, warm: one untimed call, then the median of ``reps``."""
    layout, device = engine.layout, engine.device
    es = ES(population_size=work.members, sigma=work.sigma)
    mean = [torch.zeros(s, device=device) for s in layout.shapes()]
    state = es.init(mean, seed=state_seed)
    fitness = torch.randn(work.members, generator=torch.Generator().manual_seed(1))
    tensors: list[Tensor] = []

    def sample() -> None:
        tensors[:] = es.sample(state, es.ask(state), dtype=engine.dtype)

    def warm_median(fn: Callable[[], Any]) -> float:
        fn()
        return statistics.median(timed(device, fn)[0] for _ in range(reps))

    book = {
        "sample_s": warm_median(sample),
        "tell_s": warm_median(lambda: es.tell(state, es.ask(state), fitness)),
    }
    pop = LoraPopulation(layout, tuple(tensors))
    fast = engine.fast
    if fast is not None:
        book["engine_load_s"] = warm_median(lambda: fast.load_lora(pop))
    return pop, book


def time_engine(
    engine: LocalEngine,
    ids: Tensor,
    adapters: LoraPopulation | None,
    work: Workload,
    reps: int,
) -> Timing:
    """evolm (adapters) or base (None) on all N*P rows: one warm-up, then ``reps`` timed runs."""
    rows = ids.repeat(work.members, 1)
    mask = torch.ones_like(rows)
    sampling = Sampling(max_new_tokens=work.new_tokens)

    def run() -> Tensor:
        return generate_ids(engine, rows, mask, adapters, sampling, eos_ids=[])

    warm_s, out = timed(engine.device, run)
    if engine.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(engine.device)
    times, phases = [], []
    for _ in range(reps):
        seconds, out = timed(engine.device, run)
        times.append(seconds)
        phases.append(engine.last_timings)
    extra: dict[str, Any] = {"first_call_s": warm_s}
    if phases and phases[0]:
        extra.update({k: statistics.median(p[k] for p in phases) for k in phases[0]})
        if "decode_s" in extra:  # the wave path's phases
            extra["decode_ms_per_step"] = 1e3 * extra["decode_s"] / max(1.0, extra["steps"] - 1)
        elif "generate_s" in extra:  # continuous batching: the time between prefills
            decode = extra["generate_s"] - extra["prefill_s"]
            extra["decode_ms_per_step"] = 1e3 * decode / max(1.0, extra["steps"])
    if engine.device.type == "cuda":
        extra["peak_memory_bytes"] = torch.cuda.max_memory_allocated(engine.device)
    return Timing(statistics.median(times), int(out.numel()), times, extra)


def _perturb(params: list[Tensor], seed: int, sign: float, sigma: float) -> None:
    gen = torch.Generator(params[0].device)
    for i, p in enumerate(params):
        gen.manual_seed(mix_seed(seed, i))
        noise = torch.randn(p.shape, generator=gen, device=p.device, dtype=p.dtype)
        p.add_(noise, alpha=sign * sigma)


def time_paper(engine: LocalEngine, ids: Tensor, work: Workload, k: int, fast: bool) -> Timing:
    """The paper's method on ``k`` members (HF generate, or evolm's engine if ``fast``)."""
    model, device = engine.model, engine.device
    params = list(model.parameters())
    mask = torch.ones_like(ids)
    sampling = Sampling(max_new_tokens=work.new_tokens)

    def member(m: int) -> tuple[float, int]:
        perturb_s, _ = timed(device, lambda: _perturb(params, m, 1.0, work.sigma))
        if fast:
            gen_s, out = timed(
                device, lambda: generate_ids(engine, ids, mask, None, sampling, eos_ids=[])
            )
            n = out.numel()
        else:
            gen_s, out = timed(device, lambda: _hf_generate(model, ids, work.new_tokens))
            n = (out.shape[1] - ids.shape[1]) * ids.shape[0]
        restore_s, _ = timed(device, lambda: _perturb(params, m, -1.0, work.sigma))
        perturbs.append(perturb_s + restore_s)
        return perturb_s + gen_s + restore_s, n

    perturbs: list[float] = []
    with torch.inference_mode(), detached(model, engine.layout, engine.layers):
        member(work.members)  # warm-up, a member outside the population
        perturbs.clear()
        runs = [member(m) for m in range(k)]
    return _scaled(runs, work, {"perturb_restore_s_per_member": statistics.median(perturbs)})


def time_hf_lora(
    engine: LocalEngine, ids: Tensor, pop: LoraPopulation, work: Workload, k: int
) -> Timing:
    """One HF generate per member with its single LoRA (MultiLoraLinear with one member)."""

    def member(m: int) -> tuple[float, int]:
        single = LoraPopulation.single(pop.layout, pop.member(m))
        load_population(engine.layers, single, engine.device, engine.dtype)
        seconds, out = timed(
            engine.device, lambda: _hf_generate(engine.model, ids, work.new_tokens)
        )
        return seconds, (out.shape[1] - ids.shape[1]) * ids.shape[0]

    try:
        with torch.inference_mode():
            member(0)  # warm-up
            runs = [member(m) for m in range(k)]
    finally:
        load_population(engine.layers, None, engine.device, engine.dtype)
    return _scaled(runs, work, {})


def time_external(
    runner: Runner, ids: Tensor, pop: LoraPopulation, work: Workload, reps: int
) -> Timing:
    """An external method (e.g. evolm with server=sglang): one warm-up, then ``reps`` runs."""
    device = pop.tensors[0].device
    runner(work, ids, pop)
    times, outs = [], []
    for _ in range(reps):
        seconds, out = timed(device, lambda: runner(work, ids, pop))
        times.append(seconds)
        outs.append(out)
    extra = {k: v for k, v in outs[-1].items() if k != "tokens"}
    return Timing(statistics.median(times), int(outs[-1]["tokens"]), times, extra)


def time_adapter_writes(pop: LoraPopulation, folder: str, base_model: str) -> float:
    """Writing every member as a PEFT adapter directory (what server engines do per generation)."""
    start = time.perf_counter()
    for m in range(len(pop)):
        save_adapter(f"{folder}/m{m:03d}", pop.layout, pop.member(m), base_model)
    return time.perf_counter() - start


def hf_forced_logits(
    engine: LocalEngine, pop: LoraPopulation, full: Tensor, prompt_len: int
) -> Tensor:
    """The reference: the HF modules with ``pop``'s members in their MultiLoraLinear wrappers
    (member-major rows), logits from the last prompt position on, fp32."""
    load_population(engine.layers, pop, engine.device, engine.dtype)
    try:
        with torch.inference_mode():
            return engine.model(input_ids=full).logits[:, prompt_len - 1 :].float()
    finally:
        load_population(engine.layers, None, engine.device, engine.dtype)


def _hf_generate(model: Any, ids: Tensor, new_tokens: int) -> Tensor:
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    if out.shape[1] - ids.shape[1] != new_tokens:
        raise RuntimeError(
            f"HF generate made {out.shape[1] - ids.shape[1]} tokens, not {new_tokens}"
        )
    return out


def _scaled(runs: list[tuple[float, int]], work: Workload, extra: dict[str, Any]) -> Timing:
    per_member = statistics.median(s for s, _ in runs)
    extra = {**extra, "members_timed": len(runs), "seconds_per_member": per_member}
    return Timing(per_member * work.members, runs[0][1] * work.members, [s for s, _ in runs], extra)
