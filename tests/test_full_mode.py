"""es.mean=full: full-weight ES with low-rank members (evolm.es.lowrank) and its run."""

from __future__ import annotations

import math

import pytest
import torch

from evolm.errors import ConfigError
from evolm.es import ES
from evolm.es.lowrank import FullES, cosine

SHAPES = [(24, 16), (16, 40), (40, 16)]


def full_es(rank: int = 4, **kw: object) -> FullES:
    es = ES(**{"population_size": 8, "sigma": 0.01, "alpha": 0.5, "mean": "full", **kw})
    names = tuple(f"w{k}.weight" for k in range(len(SHAPES)))
    return FullES(es, rank=rank, lora_scaling=2.0, names=names, chunk=3)


def weights(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen) * 0.05 for s in SHAPES]


@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("update", ["paper", "natural", "openai"])
def test_fold_in_equals_the_intended_update(antithetic: bool, update: str) -> None:
    """The fp32 master's change equals alpha * the dense sum of every member's perturbation
    (cosine >= 0.9999, in fact ~1 - 1e-12); the bf16 working copy's change is reported."""
    strat = full_es(antithetic=antithetic, update=update)
    state = strat.init(weights(), seed=3)
    before = [m.clone() for m in state.mean]
    pop = strat.ask(state)
    fitness = torch.randn(len(pop), generator=torch.Generator().manual_seed(1))
    intended = strat.intended_update(state, pop, fitness)
    new, stats = strat.tell(state, pop, fitness)
    change = [a - b for a, b in zip(new.mean, before, strict=True)]
    assert cosine(change, intended) >= 0.9999
    rel = math.sqrt(
        sum(float((c - i).double().norm() ** 2) for c, i in zip(change, intended, strict=True))
    )
    assert rel / math.sqrt(sum(float(i.norm() ** 2) for i in intended)) < 1e-5
    assert stats.update_norm == pytest.approx(
        math.sqrt(sum(float(i.norm() ** 2) for i in intended)), rel=1e-5
    )
    assert state.consumed and not new.consumed and new.generation == 1
    bf16 = [
        a.bfloat16().double() - b.bfloat16().double() for a, b in zip(new.mean, before, strict=True)
    ]
    assert 0 < cosine(bf16, intended) <= 1  # reported by launchers/full_mode_gpu.py


def test_members_are_the_perturbations_served_as_lora() -> None:
    """Member i's adapter (lora_scaling * B_i @ A_i) is sigma * sign_i * U V / sqrt(r), entries
    of std sigma; antithetic pairs mirror exactly; nothing is [N, out, in]."""
    strat = full_es(rank=4, antithetic=True, population_size=400, sigma=0.01)
    state = strat.init(weights(), seed=0)
    pop = strat.ask(state)
    factors = strat.sample(state, pop)
    assert [tuple(t.shape) for t in factors[:2]] == [(400, 4, 16), (400, 24, 4)]
    a, b = factors[0], factors[1]
    delta = strat.lora_scaling * b @ a  # [N, out, in] here only because the test is tiny
    assert torch.equal(delta[0], -delta[1])
    assert delta.std().item() == pytest.approx(0.01, rel=0.05)


def test_adam_and_weight_decay_match_lora_modes_rule() -> None:
    """Full mode steps with lora mode's optimiser (evolm.es.optim.ascend): Adam's first step
    moves each entry by about alpha in the direction's sign; decay shrinks the mean."""
    strat = full_es(optimizer="adam", alpha=0.001, antithetic=True)
    state = strat.init(weights(), seed=0)
    before = [m.clone() for m in state.mean]
    pop = strat.ask(state)
    fitness = torch.arange(len(pop), dtype=torch.float64)
    direction = [strat.direction(state, k, _weights(strat, pop, fitness)) for k in range(3)]
    new, _ = strat.tell(state, pop, fitness)
    assert new.opt["step"] == 1
    for m, b, d in zip(new.mean, before, direction, strict=True):
        torch.testing.assert_close(m - b, 0.001 * torch.sign(d), atol=2e-6, rtol=1e-3)


def _weights(strat: FullES, pop, fitness) -> dict[int, float]:  # type: ignore[no-untyped-def]
    from evolm.es.shaping import SHAPINGS

    out: dict[int, float] = {}
    for s, sign, z in zip(
        pop.seeds, pop.signs, SHAPINGS[strat.es.shaping](fitness).tolist(), strict=True
    ):
        out[s] = out.get(s, 0.0) + sign * z
    return out


def test_bad_mean_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"mean.*unknown 'bad'.*lora, full"):
        ES(mean="bad")
