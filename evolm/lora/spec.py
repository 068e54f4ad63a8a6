"""What a LoRA adapter looks like (rank, alpha, targets) and how the ES mean starts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from evolm.errors import ConfigError

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
TARGET_MODULES = ATTENTION_MODULES + MLP_MODULES
INITS = ("zero_b", "random")
NOISE_SCALES = ("uniform", "weight_mean")


@dataclass(frozen=True)
class LoraSpec:
    """The LoRA parameter set that ES searches over.

    Attributes:
        rank: r of every adapter (A is r x in, B is out x r).
        alpha: ``lora_alpha``; the delta is ``alpha / rank * B @ A`` (no rsLoRA, as every server
            scales it).
        target_modules: projections that get an adapter (any of q,k,v,o,gate,up,down ``_proj``).
        target_layers: decoder layer indices; ``None`` means every layer.
        init: ``zero_b`` (A ~ N(0, init_scale^2), B = 0: the mean starts as the base model) or
            ``random`` (A and B both ~ N(0, init_scale^2), as the seed prototypes did).
        init_scale: std of the initial factors (times the per-layer scale, see ``noise_scale``).
        noise_scale: ``uniform`` (every tensor perturbed by ``es.sigma``) or ``weight_mean``
            (layer l's tensors by ``sigma * mean|W_l|`` over its target base weights, seed 000).
    """

    rank: int = 4
    alpha: float = 8.0
    target_modules: Sequence[str] = TARGET_MODULES
    target_layers: Sequence[int] | None = None
    init: str = "zero_b"
    init_scale: float = 0.01
    noise_scale: str = "uniform"

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ConfigError("rank", f"must be >= 1, got {self.rank}", "set lora.rank=1 or more")
        if not (math.isfinite(self.alpha) and self.alpha > 0):
            raise ConfigError(
                "alpha", f"must be > 0 and finite, got {self.alpha}", "e.g. lora.alpha=2*rank"
            )
        unknown = sorted(set(self.target_modules) - set(TARGET_MODULES))
        if unknown or not self.target_modules:
            raise ConfigError(
                "target_modules",
                f"unknown or empty: {unknown or '[]'}",
                f"choose from {list(TARGET_MODULES)}",
            )
        if len(set(self.target_modules)) != len(self.target_modules):
            raise ConfigError("target_modules", "lists a module twice", "list each module once")
        if self.target_layers is not None and (
            not self.target_layers or min(self.target_layers) < 0
        ):
            raise ConfigError(
                "target_layers",
                f"must be non-negative indices, got {list(self.target_layers)}",
                "use null for all layers",
            )
        if self.init not in INITS:
            raise ConfigError("init", f"unknown init {self.init!r}", f"choose from {list(INITS)}")
        if not (math.isfinite(self.init_scale) and self.init_scale >= 0):
            raise ConfigError(
                "init_scale", f"must be >= 0 and finite, got {self.init_scale}", "e.g. 0.01"
            )
        if self.noise_scale not in NOISE_SCALES:
            raise ConfigError(
                "noise_scale", f"unknown {self.noise_scale!r}", f"choose from {list(NOISE_SCALES)}"
            )

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def init_tensor(
        self, shape: Sequence[int], is_b: bool, scale: float, generator: torch.Generator
    ) -> torch.Tensor:
        """One initial fp32 factor; ``scale`` is the tensor's per-layer noise scale."""
        if is_b and self.init == "zero_b":
            return torch.zeros(*shape)
        return torch.randn(*shape, generator=generator) * (self.init_scale * scale)
