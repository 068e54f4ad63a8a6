"""What a LoRA adapter looks like (rank, alpha, targets) and how the ES mean starts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from evolm.errors import ConfigError
from evolm.lora.adapter_files import AdapterError, read_adapter_config

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
TARGET_MODULES = ATTENTION_MODULES + MLP_MODULES
INITS = ("zero_b", "random")
NOISE_SCALES = ("uniform", "weight_mean")
SIGMA_UNITS = ("weight", "factor")


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
        noise_scale: ``uniform`` (every layer alike) or ``weight_mean`` (layer l's noise times
            ``mean|W_l|`` over its target base weights, seed 000's rule).
        sigma_units: what ``es.sigma`` measures. ``weight`` (default): the std of the change
            each member makes to every entry of an adapted weight, ``dW = alpha/rank * B @ A``,
            as in full-parameter ES (the paper's sigma): the factors are perturbed by
            ``sigma * factor_noise_unit`` (see :attr:`factor_noise_unit`). ``factor``: the
            literal std of the noise added to the factors A and B.
        init_from: a PEFT LoRA adapter directory whose weights are the initial mean instead of
            ``init``'s draw: an evolm run's ``adapter/`` or any adapter of this rank, alpha and
            targets (continue fine-tuning an adapter with ES). ``init_scale`` still sets
            ``weight`` units' noise (the unit assumes A's entries have std ``init_scale``).
    """

    rank: int = 4
    alpha: float = 8.0
    target_modules: Sequence[str] = TARGET_MODULES
    target_layers: Sequence[int] | None = None
    init: str = "zero_b"
    init_scale: float = 0.01
    noise_scale: str = "uniform"
    sigma_units: str = "weight"
    init_from: str | None = None

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

        if self.sigma_units not in SIGMA_UNITS:
            raise ConfigError(
                "sigma_units", f"unknown {self.sigma_units!r}", f"choose from {list(SIGMA_UNITS)}"
            )
        if self.sigma_units == "weight" and self.init_scale == 0:
            raise ConfigError(
                "init_scale",
                "is 0, so no member changes a weight to first order (dW = B eps_A + eps_B A = 0)",
                "set lora.init_scale > 0, e.g. 0.1",
            )
        if self.init_from is not None:
            self._check_init_from(self.init_from)

    def _check_init_from(self, path: str) -> None:
        """The adapter's config is readable and of this rank and alpha (its tensors are checked
        against the model's layout when the run's mode is made, before the model loads)."""
        try:
            config = read_adapter_config(path)
        except AdapterError as e:
            raise ConfigError(
                "init_from", str(e), "give a PEFT LoRA adapter directory, e.g. <run>/adapter"
            ) from None
        if config["r"] != self.rank or float(config["lora_alpha"]) != float(self.alpha):
            raise ConfigError(
                "init_from",
                f"{path} has r={config['r']}, lora_alpha={config['lora_alpha']}, the run "
                f"lora.rank={self.rank}, lora.alpha={self.alpha}",
                f"set lora.rank={config['r']} lora.alpha={config['lora_alpha']}",
            )

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    @property
    def factor_noise_unit(self) -> float:
        """Factor noise std per unit of ``es.sigma``.

        ``weight`` units: ``1 / (alpha/rank * sqrt(rank) * init_scale)``. Perturbing B by
        ``sigma * unit * eps`` changes ``dW`` by ``alpha/rank * sigma * unit * eps @ A``, whose
        entries (sums of ``rank`` products with A's ``N(0, init_scale^2)`` entries) have std
        ``sigma`` (to first order: A's own noise, ``sigma * unit``, adds its square to A's
        variance: 1% more at ``sigma = 0.005`` with the defaults, 12% at 0.02). With
        ``noise_scale=weight_mean`` A's init, and so ``dW``, carries layer l's ``mean|W_l|``.
        An input ``x`` then moves by ``|dW x| ~ sigma * sqrt(out) * |x|``, as with the paper's
        full-rank noise of std sigma.
        ``factor`` units: 1.
        """
        if self.sigma_units == "factor":
            return 1.0
        return 1.0 / (self.scaling * math.sqrt(self.rank) * self.init_scale)

    def init_tensor(
        self, shape: Sequence[int], is_b: bool, scale: float, generator: torch.Generator
    ) -> torch.Tensor:
        """One initial fp32 factor; ``scale`` is the tensor's per-layer noise scale."""
        if is_b and self.init == "zero_b":
            return torch.zeros(*shape)
        return torch.randn(*shape, generator=generator) * (self.init_scale * scale)
