"""Full-parameter ES with low-rank members (``es.mean=full``, EGGROLL-style).

The ES mean is the full weight ``W_k [out, in]`` of every adapted module ``k``, an fp32 master
copy. Member ``i`` (seed ``s_i``, sign ``+-1``) perturbs it by the rank-``r`` matrix

    sigma * scale_k * sign_i * E_k(s_i),    E_k(s) = U_k(s) V_k(s) / sqrt(r)

where ``V_k(s) [r, in]`` and ``U_k(s) [out, r]`` are standard normal, drawn by a generator
seeded with ``mix_seed(s, k)`` as ONE flat ``randn(r * in + out * r)`` (``V`` first, then ``U``):
every (seed, module) pair has its own stream, so one module's noise can be rebuilt without the
others'. Each entry of ``E_k`` has mean 0 and variance 1, so ``sigma`` means what it means in
full-rank ES (the std of each member's change to each weight entry, the paper's sigma) and in
``lora.sigma_units=weight``.

Serving: a member is a LoRA adapter (``delta = lora_scaling * B @ A``) with ``A = V`` and
``B = sigma * scale_k * sign_i / (sqrt(r) * lora_scaling) * U``; the mean's adapter is zero (the
engine's base weights ARE the mean, refreshed after every update).

Update: exactly lora mode's rules (:class:`evolm.es.ES`) with ``eps_i`` replaced by ``E_k(s_i)``:
``direction_k = coef * sum_i f_i sign_i E_k(s_i)`` with ``coef`` = ``scale_k / N`` (paper),
``sigma * scale_k / N`` (natural), ``1 / (N sigma scale_k)`` (openai), then sgd or adam with
step ``alpha`` and decoupled weight decay. The sum is never a ``[N, out, in]`` tensor: per module
and per chunk of seeds it is ONE GEMM, ``[U_1 w_1 | ... | U_c w_c] @ [V_1; ...; V_c]``
(``[out, c r] @ [c r, in]``) accumulated in fp32, where ``w`` is a seed's summed shaped fitness
(antithetic pairs share a seed: one GEMM column block for both).

Memory: :meth:`FullES.tell` updates the master IN PLACE (a 7B model's adapted weights are 26 GB
in fp32: a copy would not fit beside them on one GPU), one module at a time; the extra memory is
one module's direction and step (``out x in`` fp32 each) plus one chunk of noise. The state
passed in is marked ``consumed`` (its tensors now hold the new mean): a checkpoint must never be
written from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from evolm.es.noise import mix_seed, new_generator
from evolm.es.optim import ascend
from evolm.es.shaping import SHAPINGS
from evolm.es.state import ESState, Population, TellStats
from evolm.es.strategy import ES, _check_generation, _fitness_stats, _update_coef


def module_noise(
    seed: int, module: int, rank: int, shape: Sequence[int], generator: torch.Generator, out: Tensor
) -> tuple[Tensor, Tensor]:
    """``(V [r, in], U [out, r])`` of (``seed``, ``module``) for a weight of ``shape`` (out, in),
    drawn into the flat fp32 ``out`` (``r * (in + out)`` elements, on the generator's device)."""
    rows, cols = shape
    generator.manual_seed(mix_seed(seed, module))
    out.normal_(generator=generator)
    return out[: rank * cols].view(rank, cols), out[rank * cols :].view(rows, rank)


@dataclass(frozen=True)
class FullES(ES):
    """ES over full weights with rank-``rank`` members (see the module docstring).

    The hyperparameters (population, sigma, alpha, antithetic, shaping, update, optimizer,
    weight decay, Adam's) are :class:`ES`'s, and so are :meth:`ask` and the protocol's other
    methods; ``names`` names each mean tensor (the parameter, e.g.
    ``model.layers.0.self_attn.q_proj.weight``); ``lora_scaling`` is the serving layout's
    ``alpha / rank``; ``chunk`` seeds go into one GEMM of :meth:`tell`. :meth:`of` builds one
    from an :class:`ES` of the same hyperparameters.
    """

    mean: str = "full"
    rank: int = 1
    lora_scaling: float = 1.0
    names: tuple[str, ...] = ()
    chunk: int = 32
    member_dtype: torch.dtype | None = None
    """The dtype :meth:`sample` returns by default (None: fp32); the composition root sets the
    engine's (bf16 on GPUs: a 7B population of 256 at rank 16 is 20 GB instead of 41 GB)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rank < 1 or self.chunk < 1 or not self.lora_scaling > 0:
            raise ValueError(f"rank {self.rank}, chunk {self.chunk}, scaling {self.lora_scaling}")

    @classmethod
    def of(cls, es: ES, **serving: Any) -> FullES:
        """``es``'s hyperparameters with full mode's serving fields (``rank``, ``names``...)."""
        hyper = {f.name: getattr(es, f.name) for f in fields(ES)}
        return cls(**{**hyper, "mean": "full", **serving})

    def init(
        self,
        mean: Sequence[Tensor],
        seed: int,
        scales: Sequence[float] | None = None,
        *,
        noise_device: torch.device | str | None = None,
    ) -> ESState:
        """Start from the weights ``mean`` (copied to fp32: the master) with run ``seed``;
        ``scales`` multiplies sigma per module (default 1.0)."""
        if len(mean) != len(self.names):
            raise ValueError(f"{len(mean)} weights for {len(self.names)} names")
        if any(m.dim() != 2 for m in mean):
            raise ValueError("full mode's mean tensors are weight matrices [out, in]")
        return super().init(mean, seed, scales, noise_device=noise_device)

    moves_base = True  # the engine's base weights are the mean

    def named(self, state: ESState) -> dict[str, Tensor]:
        """The master weights by parameter name (the tensors themselves, not copies)."""
        return dict(zip(self.names, state.mean, strict=True))

    def served_base(self, state: ESState) -> dict[str, Tensor] | None:
        """The master weights by parameter name: what the engine serves after every tell."""
        return self.named(state)

    def weight_change(
        self,
        before: ESState,
        after: ESState,
        stats: TellStats,
        adapter_norm: Callable[[Sequence[Tensor], Sequence[Tensor] | None], float],
    ) -> tuple[float, float | None]:
        """``(update, None)``: the tell's own update norm (``before`` was updated in place)."""
        return stats.update_norm, None

    def factor_shapes(self, state: ESState) -> list[tuple[int, int]]:
        """The members' LoRA factor shapes, ``A [r, in]`` then ``B [out, r]`` per module."""
        out: list[tuple[int, int]] = []
        for m in state.mean:
            out += [(self.rank, m.shape[1]), (m.shape[0], self.rank)]
        return out

    def mean_adapter(
        self, state: ESState, device: torch.device | str | None = None
    ) -> list[Tensor]:
        """The mean's adapter: zeros (the engine's base weights are the mean)."""
        dev = state.mean[0].device if device is None else device
        return [torch.zeros(s, device=dev) for s in self.factor_shapes(state)]

    def sample(
        self,
        state: ESState,
        pop: Population,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> list[Tensor]:
        """Every member's LoRA factors, stacked: per module ``A [N, r, in]`` then
        ``B [N, out, r]`` (the product ``lora_scaling * B_i @ A_i`` is member i's perturbation),
        computed in fp32 and cast once to ``dtype`` (default :attr:`member_dtype`).

        Each distinct seed's noise of a module is drawn once (antithetic pairs share it); the
        peak extra memory is one module's ``[n_unique, r (in + out)]`` fp32 noise.
        """
        _check_generation(state, pop)
        unique = list(dict.fromkeys(pop.seeds))
        row = {s: j for j, s in enumerate(unique)}
        index = torch.tensor([row[s] for s in pop.seeds], dtype=torch.long)
        gen = new_generator(state.noise_device)
        index = index.to(gen.device)
        out: list[Tensor] = []
        for k, (m, scale) in enumerate(zip(state.mean, state.scales, strict=True)):
            rows, cols = m.shape
            flat = torch.empty(len(unique), self.rank * (rows + cols), device=gen.device)
            for j, seed in enumerate(unique):
                module_noise(seed, k, self.rank, m.shape, gen, flat[j])
            v = flat[:, : self.rank * cols].view(-1, self.rank, cols)
            u = flat[:, self.rank * cols :].view(-1, rows, self.rank)
            unit = self.sigma * scale / (math.sqrt(self.rank) * self.lora_scaling)
            coef = torch.tensor([unit * s for s in pop.signs], device=gen.device)
            a = v.index_select(0, index)
            b = u.index_select(0, index).mul_(coef.view(-1, 1, 1))
            target = m.device if device is None else torch.device(device)
            dt = dtype or self.member_dtype or torch.float32
            out += [a.to(target, dt), b.to(target, dt)]
        return out

    def direction(self, state: ESState, k: int, weights: Mapping[int, float]) -> Tensor:
        """Module ``k``'s ascent direction ``coef * sum_s w_s U_k(s) V_k(s) / sqrt(r)`` (fp32,
        ``[out, in]``, on the noise device) from per-seed weights ``w_s``: one GEMM per chunk
        of seeds, never a per-member ``[out, in]`` product."""
        m, scale = state.mean[k], state.scales[k]
        rows, cols = m.shape
        r, gen = self.rank, new_generator(state.noise_device)
        acc = torch.zeros(rows, cols, device=gen.device)
        seeds = [(s, w) for s, w in weights.items() if w != 0.0]
        width = min(self.chunk, max(1, len(seeds)))
        flat = torch.empty(width, r * (rows + cols), device=gen.device)
        for lo in range(0, len(seeds), self.chunk):
            part = seeds[lo : lo + self.chunk]
            buf = flat[: len(part)]
            for j, (seed, _) in enumerate(part):
                module_noise(seed, k, r, m.shape, gen, buf[j])
            v = buf[:, : r * cols].reshape(len(part) * r, cols)  # [c r, in]
            w = torch.tensor([x for _, x in part], dtype=torch.float32, device=gen.device)
            u = buf[:, r * cols :].view(len(part), rows, r) * w.view(-1, 1, 1)
            u = u.permute(1, 0, 2).reshape(rows, len(part) * r)  # [out, c r]
            acc.addmm_(u, v)
        coef = _update_coef(self.update, self.sigma, scale, self.population_size)
        return acc.mul_(coef / math.sqrt(r))

    def tell(self, state: ESState, pop: Population, fitness: Tensor) -> tuple[ESState, TellStats]:
        """Fold the population's update into the fp32 master, module by module, IN PLACE;
        returns the new state (sharing the master's tensors) and the stats. ``state`` is marked
        ``consumed``."""
        _check_generation(state, pop)
        fitness = torch.as_tensor(fitness).detach().to("cpu", torch.float64).flatten()
        if fitness.numel() != len(pop):
            raise ValueError(f"got {fitness.numel()} fitness values for {len(pop)} members")
        shaped = SHAPINGS[self.shaping](fitness).tolist()
        weights: dict[int, float] = {}
        for seed, sign, z in zip(pop.seeds, pop.signs, shaped, strict=True):
            weights[seed] = weights.get(seed, 0.0) + sign * z
        state.consumed = True
        adam = self.optimizer == "adam"
        step = int(state.opt["step"]) if adam else 0
        ms, vs = (list(state.opt["m"]), list(state.opt["v"])) if adam else ([], [])
        update_sq = mean_sq = 0.0
        for k, m in enumerate(state.mean):
            d = self.direction(state, k, weights).to(m.device)
            opt = {"step": step, "m": [ms[k]], "v": [vs[k]]} if adam else {}
            (new,), new_opt = ascend(
                self.optimizer,
                [m],
                [d],
                opt,
                lr=self.alpha,
                weight_decay=self.weight_decay,
                beta1=self.beta1,
                beta2=self.beta2,
                eps=self.eps,
            )
            del d
            update_sq += torch.linalg.vector_norm(new - m, dtype=torch.float64).item() ** 2
            m.copy_(new)
            mean_sq += torch.linalg.vector_norm(m, dtype=torch.float64).item() ** 2
            if adam:
                ms[k], vs[k] = new_opt["m"][0], new_opt["v"][0]
        opt_state = {"step": step + 1, "m": ms, "v": vs} if adam else {}
        new_state = ESState(
            mean=list(state.mean),
            seed=state.seed,
            generation=state.generation + 1,
            scales=list(state.scales),
            noise_device=state.noise_device,
            opt=opt_state,
        )
        stats = TellStats(
            **_fitness_stats(fitness),
            update_norm=math.sqrt(update_sq),
            mean_norm=math.sqrt(mean_sq),
        )
        return new_state, stats

    def intended_update(
        self, state: ESState, pop: Population, fitness: Tensor, modules: Sequence[int] | None = None
    ) -> list[Tensor]:
        """Reference for tests and measurements: ``alpha * direction`` of the given modules
        (all: None) for sgd without weight decay, summed member by member in float64 from the
        dense ``[out, in]`` products (slow: small shapes only)."""
        shaped = SHAPINGS[self.shaping](torch.as_tensor(fitness).double().cpu().flatten()).tolist()
        gen = new_generator(state.noise_device)
        out = []
        for k in range(len(state.mean)) if modules is None else modules:
            m, scale = state.mean[k], state.scales[k]
            rows, cols = m.shape
            acc = torch.zeros(rows, cols, dtype=torch.float64, device=gen.device)
            flat = torch.empty(self.rank * (rows + cols), device=gen.device)
            for seed, sign, z in zip(pop.seeds, pop.signs, shaped, strict=True):
                v, u = module_noise(seed, k, self.rank, m.shape, gen, flat)
                acc += (sign * z) * (u.double() @ v.double())
            coef = _update_coef(self.update, self.sigma, scale, self.population_size)
            out.append(acc * (self.alpha * coef / math.sqrt(self.rank)))
        return out


def cosine(a: Sequence[Tensor], b: Sequence[Tensor]) -> float:
    """Cosine similarity of two lists of tensors taken as one flat vector each (float64)."""
    dot = na = nb = 0.0
    for x, y in zip(a, b, strict=True):
        x, y = x.double().flatten(), y.double().flatten().to(x.device)
        dot += float(x @ y)
        na += float(x @ x)
        nb += float(y @ y)
    return dot / math.sqrt(na * nb) if na > 0 and nb > 0 else float("nan")
