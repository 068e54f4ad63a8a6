"""Pure-torch Evolution Strategies (ES MAXIMISES fitness): strategy, noise, shaping, optimizers."""

from evolm.es.noise import member_noise, mix_seed
from evolm.es.shaping import SHAPINGS, centered_ranks, zscore
from evolm.es.state import ESState, Population, TellStats
from evolm.es.strategy import ES

__all__ = [
    "ES",
    "SHAPINGS",
    "ESState",
    "Population",
    "TellStats",
    "centered_ranks",
    "member_noise",
    "mix_seed",
    "zscore",
]
