"""Tests for the pure-torch ES core: noise, shaping, ask/sample/tell, optimizers, config checks."""

from __future__ import annotations

import dataclasses
import io
import math
from typing import Any

import pytest
import torch
from torch import Tensor

from evolm.errors import ConfigError
from evolm.es import (
    ES,
    SHAPINGS,
    ESState,
    Population,
    centered_ranks,
    member_noise,
    mix_seed,
    zscore,
)

SHAPES = [(10, 50), (20, 20), (100,)]  # 1,000 dimensions over three tensors of different ranks
TINY_SHAPES = [(3,), (2, 2)]


def _quadratic(target: list[Tensor]) -> Any:
    """Fitness to MAXIMISE: -||x - x*||^2 over all tensors, for stacked members [N, *shape]."""

    def fitness(members: list[Tensor]) -> Tensor:
        return -sum((m - t).pow(2).flatten(1).sum(1) for m, t in zip(members, target, strict=True))

    return fitness


def _distance(a: list[Tensor], b: list[Tensor]) -> float:
    return math.sqrt(sum((x - y).pow(2).sum().item() for x, y in zip(a, b, strict=True)))


def _tensors(x: Any) -> list[Tensor]:
    """Every tensor inside nested dicts/lists/tuples/dataclasses."""
    if isinstance(x, Tensor):
        return [x]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return _tensors([getattr(x, f.name) for f in dataclasses.fields(x)])
    if isinstance(x, dict):
        return _tensors(list(x.values()))
    if isinstance(x, list | tuple):
        return [t for item in x for t in _tensors(item)]
    return []


def _tiny_state(es: ES, seed: int = 3, scales: list[float] | None = None) -> ESState:
    gen = torch.Generator().manual_seed(11)
    return es.init([torch.randn(s, generator=gen) for s in TINY_SHAPES], seed=seed, scales=scales)


# --- convergence ----------------------------------------------------------------------------

# Every case runs GENERATIONS generations from x = 0 on a random target x* ~ N(0, I) in 1,000
# dimensions (initial distance ~31.6) and must end within TOL * initial distance. SGD cases reach
# ~0.07 and Adam cases ~0.09 of the initial distance on several seeds (noise floors of a fixed
# step size), hence TOL 0.1 for SGD and 0.15 for Adam.
GENERATIONS = 400
CONVERGENCE_CASES = [
    # (shaping, antithetic, update, optimizer, alpha, tol)
    ("zscore", False, "paper", "sgd", 0.15, 0.10),
    ("zscore", True, "paper", "sgd", 0.15, 0.10),
    ("centered_ranks", False, "paper", "sgd", 0.5, 0.10),  # ranks have std ~0.29: larger alpha
    ("centered_ranks", True, "paper", "sgd", 0.5, 0.10),
    ("zscore", False, "openai", "sgd", 0.015, 0.10),  # openai divides by sigma=0.1
    ("zscore", False, "paper", "adam", 0.03, 0.15),
    ("centered_ranks", True, "openai", "adam", 0.02, 0.15),  # OpenAI-ES
]


@pytest.mark.parametrize(
    ("shaping", "antithetic", "update", "optimizer", "alpha", "tol"), CONVERGENCE_CASES
)
def test_converges_on_1000_dim_quadratic(
    shaping: str, antithetic: bool, update: str, optimizer: str, alpha: float, tol: float
) -> None:
    gen = torch.Generator().manual_seed(0)
    target = [torch.randn(s, generator=gen) for s in SHAPES]
    fitness = _quadratic(target)
    es = ES(
        population_size=50,
        sigma=0.1,
        alpha=alpha,
        antithetic=antithetic,
        shaping=shaping,
        update=update,
        optimizer=optimizer,
    )
    state = es.init([torch.zeros(s) for s in SHAPES], seed=7)
    start = _distance(state.mean, target)
    for _ in range(GENERATIONS):
        pop = es.ask(state)
        state, stats = es.tell(state, pop, fitness(es.sample(state, pop)))
    assert state.generation == GENERATIONS
    assert _distance(state.mean, target) < tol * start
    assert math.isfinite(stats.update_norm) and stats.update_norm > 0


# --- noise ----------------------------------------------------------------------------------


def test_mix_seed_is_deterministic_63_bit_and_order_sensitive() -> None:
    assert mix_seed(1, 2) == mix_seed(1, 2)
    assert len({mix_seed(1, 2), mix_seed(2, 1), mix_seed(1, 2, 0), mix_seed(1), mix_seed()}) == 5
    for args in [(0,), (-1, 5), (2**70, 3), (123456789, 0, 42)]:
        assert 0 <= mix_seed(*args) < 2**63


def test_member_noise_is_reproducible_across_calls_and_generators() -> None:
    fresh = member_noise(5, TINY_SHAPES, device="cpu")
    shared = torch.Generator()
    again = member_noise(5, TINY_SHAPES, device="cpu", generator=shared)
    member_noise(6, [(1000,)], device="cpu", generator=shared)  # reuse must not leak state
    third = member_noise(5, TINY_SHAPES, device="cpu", generator=shared)
    assert [x.shape for x in fresh] == TINY_SHAPES
    assert all(x.dtype == torch.float32 for x in fresh)
    assert all(map(torch.equal, fresh, again)) and all(map(torch.equal, fresh, third))
    other = member_noise(6, TINY_SHAPES, device="cpu")
    assert not any(map(torch.equal, fresh, other))


def test_member_noise_is_one_flat_stream_split_in_order() -> None:
    shapes = [(2, 3), (4,), (1, 5)]
    parts = member_noise(9, shapes, device="cpu")
    flat = torch.empty(15).normal_(generator=torch.Generator().manual_seed(mix_seed(9)))
    assert torch.equal(torch.cat([p.flatten() for p in parts]), flat)
    assert parts[0].untyped_storage().data_ptr() == parts[2].untyped_storage().data_ptr()


@pytest.mark.parametrize(("seed_a", "seed_b"), [(0, 0), (0, 1), (3, 4)])
def test_noise_is_standard_normal_and_uncorrelated(seed_a: int, seed_b: int) -> None:
    """Across the tensor segments of one member and across members: |corr| < 0.05."""
    shapes = [(200_000,), (400, 500), (200_000,)]
    a = [x.flatten() for x in member_noise(seed_a, shapes, device="cpu")]
    b = [x.flatten() for x in member_noise(seed_b, shapes, device="cpu")]
    for x in a:
        assert abs(x.mean().item()) < 0.01 and abs(x.std().item() - 1) < 0.01
    pairs = [(a[0], a[1]), (a[0], a[2]), (a[1], a[2])]  # same member, different tensors
    if seed_a != seed_b:
        pairs += [(a[t], b[t]) for t in range(3)]  # same tensor, different members
    for x, y in pairs:
        assert abs(torch.corrcoef(torch.stack([x, y]))[0, 1].item()) < 0.05


def test_equal_shapes_get_different_noise() -> None:
    """The paper's bug (one seed reused per tensor) gives same-shaped tensors equal noise."""
    a, b = member_noise(1, [(64, 64), (64, 64)], device="cpu")
    assert not torch.equal(a, b)


@pytest.mark.parametrize("antithetic", [False, True])
def test_sample_matches_member_and_noise_formula(antithetic: bool) -> None:
    es = ES(population_size=6, sigma=0.1, antithetic=antithetic)
    state = _tiny_state(es, scales=[2.0, 0.5])
    pop = es.ask(state)
    stacked = es.sample(state, pop)
    assert [x.shape for x in stacked] == [(6, *s) for s in TINY_SHAPES]
    for i in range(len(pop)):
        for t, x in enumerate(es.member(state, pop, i)):
            assert torch.equal(x, stacked[t][i])  # bit-identical, not just close
            eps = member_noise(pop.seeds[i], TINY_SHAPES, device="cpu")[t]
            want = state.mean[t] + 0.1 * state.scales[t] * pop.signs[i] * eps
            torch.testing.assert_close(x, want)
    assert all(x.dtype == torch.bfloat16 for x in es.sample(state, pop, dtype=torch.bfloat16))


def test_antithetic_pairs_are_exact_negatives() -> None:
    es = ES(population_size=8, sigma=0.01, antithetic=True)
    pop_zero = es.ask(es.init([torch.zeros(s) for s in SHAPES], seed=1))
    assert pop_zero.seeds[0::2] == pop_zero.seeds[1::2]
    assert pop_zero.signs == (1, -1) * 4
    for x in es.sample(es.init([torch.zeros(s) for s in SHAPES], seed=1), pop_zero):
        assert torch.equal(x[0::2], -x[1::2])  # exact: around a zero mean nothing rounds
    state = _tiny_state(es)
    for m, x in zip(state.mean, es.sample(state, es.ask(state)), strict=True):
        # Around a nonzero mean, (m + d) - m and (m - d) - m differ only by fp32 rounding of m+-d.
        torch.testing.assert_close(x[0::2] - m, -(x[1::2] - m), rtol=0, atol=1e-6)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_nothing_of_the_noise_is_stored(optimizer: str) -> None:
    es = ES(population_size=4, antithetic=True, optimizer=optimizer)
    state = _tiny_state(es)
    pop = es.ask(state)
    assert type(pop.generation) is int
    assert all(type(x) is int for x in pop.seeds + pop.signs)
    assert _tensors(pop) == []
    state, _ = es.tell(state, pop, torch.tensor([1.0, 2.0, 3.0, 4.0]))
    copies = 1 if optimizer == "sgd" else 3  # mean, plus Adam's m and v
    mean_numel = sum(m.numel() for m in state.mean)
    assert sum(t.numel() for t in _tensors(state)) == copies * mean_numel


class _CountingGenerator(torch.Generator):
    seedings = 0

    def manual_seed(self, seed: int) -> torch.Generator:
        type(self).seedings += 1
        return super().manual_seed(seed)


@pytest.mark.parametrize("antithetic", [False, True])
def test_one_generator_seeding_per_unique_seed(
    antithetic: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """400 tensors: sample and tell each seed a generator once per distinct seed, not per tensor."""
    es = ES(population_size=6, sigma=0.1, antithetic=antithetic)
    state = es.init([torch.zeros(3, 2) for _ in range(400)], seed=5)
    pop = es.ask(state)
    unique = len(set(pop.seeds))
    assert unique == (3 if antithetic else 6)
    monkeypatch.setattr(torch, "Generator", _CountingGenerator)
    monkeypatch.setattr(_CountingGenerator, "seedings", 0)
    members = es.sample(state, pop)
    assert _CountingGenerator.seedings == unique
    monkeypatch.setattr(_CountingGenerator, "seedings", 0)
    es.tell(state, pop, torch.arange(6.0))
    assert _CountingGenerator.seedings == unique
    assert len(members) == 400 and members[399].shape == (6, 3, 2)


# --- ask ------------------------------------------------------------------------------------


def test_population_depends_only_on_run_seed_and_generation() -> None:
    es = ES(population_size=10)
    a = ES(population_size=10).ask(_tiny_state(es, seed=3))
    b = es.ask(_tiny_state(es, seed=3))
    assert a == b and len(a) == 10 and len(set(a.seeds)) == 10
    assert es.ask(_tiny_state(es, seed=4)).seeds != a.seeds
    state = _tiny_state(es, seed=3)
    next_state, _ = es.tell(state, a, torch.arange(10.0))
    assert es.ask(next_state).generation == 1
    assert set(es.ask(next_state).seeds).isdisjoint(a.seeds)


# --- shaping --------------------------------------------------------------------------------


def test_zscore_has_mean_zero_std_one() -> None:
    z = zscore(torch.tensor([3.0, -1.0, 10.0, 2.5, 0.0]))
    assert abs(z.mean().item()) < 1e-12 and abs(z.std(unbiased=False).item() - 1) < 1e-6
    assert torch.equal(zscore(torch.full((4,), 2.0)), torch.zeros(4, dtype=torch.float64))


def test_centered_ranks_range_and_order() -> None:
    f = torch.tensor([0.3, -2.0, 5.0, 1.0, 0.0])
    r = centered_ranks(f)
    assert r.min().item() == -0.5 and r.max().item() == 0.5
    assert torch.equal(torch.argsort(r), torch.argsort(f))
    torch.testing.assert_close(r.sort().values, torch.linspace(-0.5, 0.5, 5, dtype=torch.float64))


@pytest.mark.parametrize("name", sorted(SHAPINGS))
def test_nan_fitness_ranks_worst(name: str) -> None:
    shaped = SHAPINGS[name](torch.tensor([1.0, float("nan"), -3.0, 2.0]))
    assert torch.isfinite(shaped).all()
    assert shaped[1].item() == shaped.min().item()
    assert shaped[3].item() == shaped.max().item()
    all_nan = SHAPINGS[name](torch.full((3,), float("nan")))
    assert torch.isfinite(all_nan).all()


@pytest.mark.parametrize("name", sorted(SHAPINGS))
def test_infinite_fitness_ranks_worst_too(name: str) -> None:
    """An infinite reward is a task's bug, not a great answer (before: +inf ranked best)."""
    shaped = SHAPINGS[name](torch.tensor([1.0, float("inf"), -3.0, float("-inf"), 2.0]))
    assert torch.isfinite(shaped).all()
    assert shaped[[1, 3]].max().item() <= shaped[[0, 2, 4]].min().item()
    assert shaped[4].item() == shaped.max().item()


def test_zscore_all_nan_gives_zeros() -> None:
    assert torch.equal(zscore(torch.full((3,), float("nan"))), torch.zeros(3, dtype=torch.float64))


# --- tell -----------------------------------------------------------------------------------


def _expected_direction(state: ESState, pop: Population, weights: list[float], t: int) -> Tensor:
    """sum_i w_i s_i eps_i for tensor t, with eps regenerated by member_noise."""
    shapes = [m.shape for m in state.mean]
    eps = [member_noise(s, shapes, device="cpu")[t] for s in pop.seeds]
    return sum(w * s * e for w, s, e in zip(weights, pop.signs, eps, strict=True))


@pytest.mark.parametrize("antithetic", [False, True])
def test_paper_update_by_hand(antithetic: bool) -> None:
    es = ES(population_size=4, sigma=0.1, alpha=0.5, antithetic=antithetic)
    state = _tiny_state(es, scales=[1.0, 2.0])
    pop = es.ask(state)
    fitness = torch.tensor([0.2, 1.5, -0.7, 0.9])
    f = fitness.double()
    z = ((f - f.mean()) / (f.std(unbiased=False) + 1e-8)).tolist()
    new, _ = es.tell(state, pop, fitness)
    for t, m in enumerate(state.mean):
        # mean += alpha / N * sum_i z_i s_i eps_i, times the tensor's noise scale.
        want = m + 0.5 / 4 * state.scales[t] * _expected_direction(state, pop, z, t)
        torch.testing.assert_close(new.mean[t], want)


def test_openai_update_by_hand() -> None:
    es = ES(population_size=6, sigma=0.05, alpha=0.01, shaping="centered_ranks", update="openai")
    state = _tiny_state(es)
    pop = es.ask(state)
    fitness = torch.tensor([3.0, 1.0, 2.0, 6.0, 5.0, 4.0])
    ranks = [-0.5 + r / 5 for r in (2, 0, 1, 5, 4, 3)]
    new, _ = es.tell(state, pop, fitness)
    for t, m in enumerate(state.mean):
        grad = _expected_direction(state, pop, ranks, t) / (6 * 0.05)
        torch.testing.assert_close(new.mean[t], m + 0.01 * grad)


def test_adam_first_step_is_alpha_times_sign_of_direction() -> None:
    kwargs: dict[str, Any] = {"population_size": 6, "sigma": 0.1}
    sgd, adam = ES(alpha=1.0, **kwargs), ES(alpha=0.01, optimizer="adam", **kwargs)
    state_sgd, state_adam = _tiny_state(sgd), _tiny_state(adam)
    pop, fitness = sgd.ask(state_sgd), torch.tensor([1.0, 4.0, 2.0, 8.0, 5.0, 7.0])
    after_sgd, _ = sgd.tell(state_sgd, pop, fitness)  # alpha=1: the change is the direction
    after_adam, _ = adam.tell(state_adam, pop, fitness)
    assert after_adam.opt["step"] == 1
    for m, s, a in zip(state_sgd.mean, after_sgd.mean, after_adam.mean, strict=True):
        g = s - m
        torch.testing.assert_close(a - m, 0.01 * g / (g.abs() + 1e-8), rtol=1e-4, atol=1e-6)


def test_weight_decay_is_decoupled() -> None:
    es = ES(population_size=4, alpha=0.1, weight_decay=0.5)
    state = _tiny_state(es)
    new, stats = es.tell(state, es.ask(state), torch.ones(4))  # equal fitness: zero direction
    for m, n in zip(state.mean, new.mean, strict=True):
        torch.testing.assert_close(n, m * (1 - 0.1 * 0.5))
    assert stats.update_norm == pytest.approx(
        0.05 * _distance(state.mean, [0 * m for m in state.mean])
    )


def test_tell_returns_new_state_and_stats() -> None:
    es = ES(population_size=4, sigma=0.1, alpha=0.1)
    state = _tiny_state(es)
    before = [m.clone() for m in state.mean]
    pop = es.ask(state)
    new, stats = es.tell(state, pop, torch.tensor([1.0, float("nan"), 3.0, 0.0]))
    assert state.generation == 0 and all(map(torch.equal, before, state.mean))
    assert new.generation == 1 and all(torch.isfinite(m).all() for m in new.mean)
    assert stats.update_norm == pytest.approx(_distance(new.mean, state.mean))
    assert stats.fitness_mean == pytest.approx(4 / 3) and stats.fitness_nonfinite == 1
    assert stats.fitness_min == 0.0 and stats.fitness_max == 3.0 and stats.mean_norm > 0


def test_tell_rejects_mismatched_inputs() -> None:
    es = ES(population_size=4)
    state = _tiny_state(es)
    pop = es.ask(state)
    with pytest.raises(ValueError, match="4 members"):
        es.tell(state, pop, torch.ones(3))
    new, _ = es.tell(state, pop, torch.arange(4.0))
    with pytest.raises(ValueError, match="generation"):
        es.tell(new, pop, torch.ones(4))


def test_init_copies_to_fp32_and_checks_scales() -> None:
    es = ES()
    source = [torch.ones(3, dtype=torch.bfloat16)]
    state = es.init(source, seed=0)
    source[0].zero_()
    assert state.mean[0].dtype == torch.float32 and torch.equal(state.mean[0], torch.ones(3))
    assert state.scales == [1.0] and state.noise_device == "cpu"
    with pytest.raises(ValueError, match="scales"):
        es.init(source, seed=0, scales=[1.0, 2.0])


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_resume_from_state_dict_is_exact(optimizer: str) -> None:
    es = ES(population_size=6, sigma=0.1, alpha=0.05, antithetic=True, optimizer=optimizer)
    fitness = _quadratic([torch.ones(s) for s in TINY_SHAPES])

    def step(state: ESState) -> ESState:
        pop = es.ask(state)
        return es.tell(state, pop, fitness(es.sample(state, pop)))[0]

    straight = step(step(step(_tiny_state(es))))
    buf = io.BytesIO()
    torch.save(step(_tiny_state(es)).state_dict(), buf)
    buf.seek(0)
    resumed = step(step(ESState.from_state_dict(torch.load(buf, weights_only=True))))
    assert resumed.generation == straight.generation == 3
    assert all(map(torch.equal, resumed.mean, straight.mean))


# --- config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "key", "words"),
    [
        ({"sigma": 0.0}, "sigma", "> 0"),
        ({"sigma": -1.0}, "sigma", "> 0"),
        ({"alpha": 0.0}, "alpha", "> 0"),
        ({"population_size": 1}, "population_size", ">= 2"),
        ({"population_size": 7, "antithetic": True}, "population_size", "antithetic"),
        ({"shaping": "ranks"}, "shaping", "centered_ranks"),
        ({"update": "sgd"}, "update", "openai"),
        ({"optimizer": "adamw"}, "optimizer", "adam"),
        ({"weight_decay": -0.1}, "weight_decay", ">= 0"),
        ({"beta1": 1.0}, "beta1", "[0, 1)"),
    ],
)
def test_bad_hyperparameters_raise_config_error(
    kwargs: dict[str, Any], key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as info:
        ES(**kwargs)
    assert info.value.key == key
    assert key in str(info.value) and words in str(info.value)


def test_defaults_are_the_paper_and_hydra_friendly() -> None:
    es = ES()
    assert (es.population_size, es.sigma, es.alpha) == (30, 1e-3, 5e-4)
    assert (es.shaping, es.update, es.optimizer, es.antithetic) == ("zscore", "paper", "sgd", False)
    assert es.weight_decay == 0.0
    for f in dataclasses.fields(ES):
        assert type(f.default) in (int, float, bool, str), f.name
