"""Evolution Strategies as a small ask/tell strategy over a list of fp32 tensors.

ES MAXIMISES fitness: higher fitness pulls the mean towards a member's perturbation.

    es = ES(population_size=30, sigma=1e-3, alpha=5e-4)
    state = es.init(mean_tensors, seed=run_seed)
    for _ in range(generations):
        pop = es.ask(state)                       # integers only
        members = es.sample(state, pop)           # [N, *shape] per tensor
        fitness = evaluate(members)               # [N], higher is better
        state, stats = es.tell(state, pop, fitness)

A member is ``mean[t] + sigma * scale[t] * sign_i * eps(seed_i)[t]`` for every tensor ``t``,
where ``eps(seed_i)`` is one flat standard normal vector over all tensors, split into per-tensor
segments and rebuilt from ``seed_i`` whenever it is needed (see :mod:`evolm.es.noise`). Both
:meth:`ES.sample` and :meth:`ES.tell` draw each distinct seed of a population once (one generator
seeding per seed, not per tensor); antithetic pairs share their draw.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from evolm.errors import ConfigError
from evolm.es.noise import fill_member_noise, mix_seed, new_generator, split_noise
from evolm.es.optim import OPTIMIZERS, ascend, init_opt_state
from evolm.es.shaping import SHAPINGS
from evolm.es.state import ESState, Population, TellStats

UPDATES = ("paper", "natural", "openai")
MEANS = ("lora", "full")


@dataclass(frozen=True)
class ES:
    """Evolution Strategies hyperparameters and the ask/tell update. ES MAXIMISES fitness.

    The defaults reproduce the paper (Qiu et al. 2025): ``population_size=30, sigma=1e-3,
    alpha=5e-4, antithetic=False, shaping="zscore", update="paper", optimizer="sgd",
    weight_decay=0``, i.e. ``mean += alpha / N * sum_i z_i * eps_i``. OpenAI-ES (Salimans et al.
    2017) is ``antithetic=True, shaping="centered_ranks", update="openai", optimizer="adam"``,
    usually with ``weight_decay > 0`` and a larger ``alpha`` (e.g. 1e-2).

    With per-tensor ``scales`` (see :meth:`init`) tensor ``t`` is perturbed by
    ``sigma * scale_t``; the paper rule then steps ``alpha * scale_t / N * sum_i z_i s_i eps_i``
    (along the perturbations) and the openai rule estimates the gradient
    ``sum_i f_i s_i eps_i / (N * sigma * scale_t)``.

    ``update="natural"`` is the paper's rule with the step measured in units of sigma:
    ``mean += alpha * sigma * scale_t / N * sum_i z_i s_i eps_i`` (the natural-gradient estimate
    of a Gaussian search distribution, up to a constant). The paper's values (sigma=1e-3,
    alpha=5e-4) are ``alpha=0.5`` here; unlike the paper's rule, changing ``sigma`` alone keeps
    the step in proportion to the perturbations.
    """

    population_size: int = 30
    """Members per generation, N (even when ``antithetic``)."""
    sigma: float = 1e-3
    """Noise standard deviation of a perturbation."""
    alpha: float = 5e-4
    """Learning rate."""
    antithetic: bool = False
    """Mirrored sampling: members 2k and 2k+1 share a seed with signs +1 and -1."""
    shaping: str = "zscore"
    """Fitness shaping: "zscore" (paper) or "centered_ranks" (OpenAI-ES)."""
    update: str = "paper"
    """"paper": direction = sum_i f_i s_i eps_i / N. "natural": sigma * sum_i f_i s_i eps_i / N
    (alpha in units of sigma). "openai": sum_i f_i s_i eps_i / (N sigma)."""
    optimizer: str = "sgd"
    """"sgd" (mean += alpha * direction) or "adam"; both ascend."""
    weight_decay: float = 0.0
    """Decoupled weight decay: mean -= alpha * weight_decay * mean each generation."""
    beta1: float = 0.9
    """Adam's first-moment decay."""
    beta2: float = 0.999
    """Adam's second-moment decay."""
    eps: float = 1e-8
    """Adam's denominator epsilon."""
    mean: str = "lora"
    """What ES moves: "lora" (the mean is a LoRA adapter, rank-limited) or "full" (the mean is
    the adapted modules' full weights in fp32, each member a low-rank perturbation of them:
    :class:`evolm.es.lowrank.FullES`, built by the composition root). This class is the lora
    mode's strategy; in full mode it holds the shared hyperparameters."""

    def __post_init__(self) -> None:
        n = self.population_size
        _check(n >= 2, "population_size", f"must be >= 2, got {n}", "set es.population_size >= 2")
        _check(
            not (self.antithetic and n % 2),
            "population_size",
            f"must be even with antithetic=True, got {n}",
            f"set es.population_size to {n + 1}, or es.antithetic=false",
        )
        for key, example in (("sigma", "0.001"), ("alpha", "0.0005"), ("eps", "1e-8")):
            value = getattr(self, key)
            _check(
                value > 0 and math.isfinite(value),
                key,
                f"must be > 0 and finite, got {value}",
                f"set es.{key} > 0, e.g. {example}",
            )
        for key, valid in (
            ("shaping", SHAPINGS),
            ("update", UPDATES),
            ("optimizer", OPTIMIZERS),
            ("mean", MEANS),
        ):
            value, names = getattr(self, key), ", ".join(valid)
            _check(
                value in valid,
                key,
                f"unknown {value!r}; valid: {names}",
                f"set es.{key} to one of: {names}",
            )
        wd = self.weight_decay
        _check(
            wd >= 0 and math.isfinite(wd),
            "weight_decay",
            f"must be >= 0 and finite, got {wd}",
            "set es.weight_decay >= 0, e.g. 0",
        )
        for key in ("beta1", "beta2"):
            value = getattr(self, key)
            _check(
                0 <= value < 1, key, f"must be in [0, 1), got {value}", f"set es.{key} in [0, 1)"
            )

    def init(
        self,
        mean: Sequence[Tensor],
        seed: int,
        scales: Sequence[float] | None = None,
        *,
        noise_device: torch.device | str | None = None,
    ) -> ESState:
        """Start from ``mean`` (copied to fp32) with run ``seed``.

        ``scales`` multiplies sigma per tensor (default 1.0 each). Noise is drawn on
        ``noise_device`` (default: the first mean tensor's device) in both :meth:`sample` and
        :meth:`tell`, whatever device the members are built on, so the two always agree.
        """
        if not mean:
            raise ValueError("mean must hold at least one tensor")
        scales = [1.0] * len(mean) if scales is None else [float(s) for s in scales]
        if len(scales) != len(mean):
            raise ValueError(f"{len(scales)} scales for {len(mean)} mean tensors")
        if not all(s > 0 for s in scales):
            raise ValueError(f"scales must be > 0, got {scales}")
        mean = [m.detach().to(dtype=torch.float32, copy=True) for m in mean]
        device = torch.device(noise_device if noise_device is not None else mean[0].device)
        return ESState(
            mean=mean,
            seed=int(seed),
            generation=0,
            scales=scales,
            noise_device=str(device),
            opt=init_opt_state(self.optimizer, mean),
        )

    def ask(self, state: ESState) -> Population:
        """The population of ``state.generation``: a pure function of (run seed, generation)."""
        n_seeds = self.population_size // 2 if self.antithetic else self.population_size
        base = [mix_seed(state.seed, state.generation, k) for k in range(n_seeds)]
        if self.antithetic:
            seeds = tuple(s for s in base for _ in range(2))
            signs = (1, -1) * n_seeds
        else:
            seeds, signs = tuple(base), (1,) * n_seeds
        return Population(generation=state.generation, seeds=seeds, signs=signs)

    def sample(
        self,
        state: ESState,
        pop: Population,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> list[Tensor]:
        """All members, stacked: per mean tensor ``t`` a ``[N, *shape]`` tensor.

        Computed in fp32 and cast to ``dtype`` at the end; placed on ``device`` (default: that
        mean tensor's device). Antithetic pairs are mirrored exactly around the mean in fp32.

        Each distinct seed's flat noise is drawn once into a ``[n_unique, total]`` fp32 buffer on
        the noise device, so the peak memory is that buffer (``n_unique * total * 4`` bytes, e.g.
        1.2 GB for 30 members of 10M parameters) on top of the returned members.
        """
        _check_generation(state, pop)
        eps = _unique_noise(state, pop.seeds)
        rows: dict[int, int] = {}
        for seed in pop.seeds:
            rows.setdefault(seed, len(rows))
        index = [rows[seed] for seed in pop.seeds]
        select = None
        if index != list(range(len(pop))):
            select = torch.tensor(index, dtype=torch.long, device=eps.device)
        coef = torch.tensor(
            [[scale * (self.sigma * s) for s in pop.signs] for scale in state.scales],
            dtype=torch.float32,
        ).to(eps.device)
        shapes = [m.shape for m in state.mean]
        out = []
        for t, (m, e) in enumerate(zip(state.mean, split_noise(eps, shapes), strict=True)):
            e = e if select is None else e.index_select(0, select)
            target = m.device if device is None else torch.device(device)
            col = coef[t].view(-1, *([1] * m.dim()))
            x = torch.addcmul(m.to(eps.device), e, col).to(target)  # one pass: mean + coef * eps
            out.append(x if dtype is None else x.to(dtype))
        return out

    def member(
        self,
        state: ESState,
        pop: Population,
        i: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> list[Tensor]:
        """Member ``i`` alone, one tensor per mean tensor; equal to ``sample(...)[t][i]``."""
        i = range(len(pop))[i]
        one = Population(pop.generation, pop.seeds[i : i + 1], pop.signs[i : i + 1])
        return [x[0] for x in self.sample(state, one, device=device, dtype=dtype)]

    # -- how the mean is served (lora: an adapter over a fixed base) ---------------------------
    moves_base = False
    """Whether the engine's base weights ARE the mean (then there is no adapter to compare with
    the base: no eval KL) rather than a fixed base the mean's adapter sits on."""

    def mean_adapter(
        self, state: ESState, device: torch.device | str | None = None
    ) -> list[Tensor]:
        """The adapter that serves the mean: the mean itself (a LoRA adapter)."""
        return state.mean

    def served_base(self, state: ESState) -> dict[str, Tensor] | None:
        """The base weights the engine must serve after a tell, by parameter name: None (the
        base never moves)."""
        return None

    def weight_change(
        self,
        before: ESState,
        after: ESState,
        stats: TellStats,
        adapter_norm: Callable[[Sequence[Tensor], Sequence[Tensor] | None], float],
    ) -> tuple[float, float | None]:
        """``(update, mean)``: the norms of the update's and of the whole mean's change to the
        adapted weights, where ``adapter_norm(a, b)`` is the norm of adapter ``a``'s weight
        change minus ``b``'s (``b`` None: ``a``'s alone)."""
        return adapter_norm(after.mean, before.mean), adapter_norm(after.mean, None)

    def tell(self, state: ESState, pop: Population, fitness: Tensor) -> tuple[ESState, TellStats]:
        """Update the mean from the fitness of ``pop`` (higher is better); returns new state, stats.

        The noise is regenerated one distinct seed at a time (one flat draw over all tensors) and
        accumulated into one flat fp32 vector, never held for the whole population: the extra
        memory is that accumulator and one draw buffer. ``state`` is not modified.
        """
        _check_generation(state, pop)
        fitness = torch.as_tensor(fitness).detach().to("cpu", torch.float64).flatten()
        if fitness.numel() != len(pop):
            raise ValueError(f"got {fitness.numel()} fitness values for {len(pop)} members")
        shaped = SHAPINGS[self.shaping](fitness).tolist()
        weights: dict[int, float] = {}
        for seed, sign, z in zip(pop.seeds, pop.signs, shaped, strict=True):
            weights[seed] = weights.get(seed, 0.0) + sign * z
        direction = self._direction(state, weights)
        mean, opt = ascend(
            self.optimizer,
            state.mean,
            direction,
            state.opt,
            lr=self.alpha,
            weight_decay=self.weight_decay,
            beta1=self.beta1,
            beta2=self.beta2,
            eps=self.eps,
        )
        new_state = ESState(
            mean=mean,
            seed=state.seed,
            generation=state.generation + 1,
            scales=list(state.scales),
            noise_device=state.noise_device,
            opt=opt,
        )
        stats = TellStats(
            **_fitness_stats(fitness),
            update_norm=_global_norm(torch._foreach_sub(mean, state.mean)),
            mean_norm=_global_norm(mean),
        )
        return new_state, stats

    def _direction(self, state: ESState, weights: dict[int, float]) -> list[Tensor]:
        """Ascent direction per tensor from per-seed weights ``sum_i f_i s_i`` (a seed's summed)."""
        total = sum(m.numel() for m in state.mean)
        gen = new_generator(state.noise_device)
        acc = torch.zeros(total, dtype=torch.float32, device=gen.device)
        buf = torch.empty_like(acc)
        for seed, w in weights.items():
            if w != 0.0:
                acc.add_(fill_member_noise(buf, seed, gen), alpha=w)
        n = self.population_size
        coefs = [_update_coef(self.update, self.sigma, scale, n) for scale in state.scales]
        out = split_noise(acc, [m.shape for m in state.mean])
        torch._foreach_mul_(out, coefs)  # one fused launch per chunk of tensors
        return [d.to(m.device) for m, d in zip(state.mean, out, strict=True)]


def _update_coef(update: str, sigma: float, scale: float, n: int) -> float:
    """What ``sum_i f_i s_i eps_i`` is multiplied by for a tensor of noise ``scale``."""
    if update == "paper":
        return scale / n
    if update == "natural":
        return sigma * scale / n
    return 1.0 / (n * sigma * scale)  # openai


def _unique_noise(state: ESState, seeds: Sequence[int]) -> Tensor:
    """``[n_unique, total]`` flat fp32 noise, one row per distinct seed in order of appearance."""
    unique = list(dict.fromkeys(seeds))
    total = sum(m.numel() for m in state.mean)
    gen = new_generator(state.noise_device)
    eps = torch.empty((len(unique), total), dtype=torch.float32, device=gen.device)
    for row, seed in zip(eps, unique, strict=True):
        fill_member_noise(row, seed, gen)
    return eps


def _fitness_stats(fitness: Tensor) -> dict[str, Any]:
    """Summary of the finite fitness values (NaN where there are none) and the non-finite count."""
    finite = fitness[torch.isfinite(fitness)]
    nonfinite = fitness.numel() - finite.numel()
    if finite.numel() == 0:
        finite = torch.full((1,), float("nan"), dtype=fitness.dtype)
    p20, p80 = torch.quantile(finite, torch.tensor([0.2, 0.8], dtype=finite.dtype)).tolist()
    return {
        "fitness_mean": finite.mean().item(),
        "fitness_std": finite.std(unbiased=False).item(),
        "fitness_min": finite.min().item(),
        "fitness_max": finite.max().item(),
        "fitness_p20": p20,
        "fitness_p80": p80,
        "fitness_nonfinite": nonfinite,
    }


def _global_norm(xs: Sequence[Tensor]) -> float:
    """L2 norm over all tensors together, with one host sync (fused per-tensor norms)."""
    return torch.stack(torch._foreach_norm(list(xs))).double().norm().item()


def _check(ok: bool, key: str, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(key, problem, fix)


def _check_generation(state: ESState, pop: Population) -> None:
    if pop.generation != state.generation:
        raise ValueError(
            f"population is from generation {pop.generation}, state is at {state.generation}"
        )
