"""What ES hands out and carries between generations: integers and plain tensors only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from evolm.es.optim import OptState


@dataclass(frozen=True)
class Population:
    """One generation's members as integers only: member ``i`` is ``(seeds[i], signs[i])``."""

    generation: int
    seeds: tuple[int, ...]
    signs: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.seeds) != len(self.signs):
            raise ValueError(f"{len(self.seeds)} seeds but {len(self.signs)} signs")
        if any(s not in (1, -1) for s in self.signs):
            raise ValueError(f"signs must be +1 or -1, got {self.signs}")

    def __len__(self) -> int:
        return len(self.seeds)


@dataclass
class ESState:
    """Everything ES carries between generations: plain tensors, ints, floats and strings.

    The population of a generation is a pure function of ``(seed, generation)``, so no RNG state
    is kept. Use :meth:`state_dict` / :meth:`from_state_dict` with ``torch.save``/``torch.load``.
    """

    mean: list[Tensor]  # fp32
    seed: int  # the run seed
    generation: int = 0
    scales: list[float] = field(default_factory=list)  # per-tensor noise multipliers
    noise_device: str = "cpu"  # noise is drawn here in sample() and tell(): keep it fixed
    opt: OptState = field(default_factory=dict)
    consumed: bool = field(default=False, compare=False)
    """Set by ``FullES.tell``, which updates the mean in place: this state's tensors hold the
    NEXT generation's mean, so it must not be checkpointed (not part of :meth:`state_dict`)."""

    def state_dict(self) -> dict[str, Any]:
        """A dict of builtins and tensors, loadable with ``torch.load(weights_only=True)``."""
        return {
            "mean": list(self.mean),
            "seed": self.seed,
            "generation": self.generation,
            "scales": list(self.scales),
            "noise_device": self.noise_device,
            "opt": dict(self.opt),
        }

    @classmethod
    def from_state_dict(cls, d: dict[str, Any]) -> ESState:
        """Inverse of :meth:`state_dict`."""
        return cls(**d)


@dataclass(frozen=True)
class TellStats:
    """What :meth:`evolm.es.ES.tell` reports of a generation (higher fitness is better).

    The fitness summaries are over the finite fitness values (NaN where there are none);
    ``fitness_nonfinite`` counts the others. ``update_norm`` is the global L2 norm of the change
    to the mean, ``mean_norm`` the norm of the new mean.
    """

    fitness_mean: float
    fitness_std: float
    fitness_min: float
    fitness_max: float
    fitness_p20: float
    fitness_p80: float
    fitness_nonfinite: int
    update_norm: float
    mean_norm: float
