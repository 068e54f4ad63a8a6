"""Where the adapters go in a model, and the order of the ES parameter tensors.

The ES mean is a flat list of fp32 tensors: for every target ``k`` (in layout order) first
``lora_A`` (r x in) then ``lora_B`` (out x r), so tensor ``2k`` is A and ``2k + 1`` is B. This
module is the one place that order is spelled: everything else reads factors through
:meth:`LoraLayout.pairs` / :meth:`LoraPopulation.factors` and the scaling through
:attr:`LoraLayout.scaling`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from evolm.errors import ConfigError
from evolm.lora.spec import ATTENTION_MODULES, LoraSpec


@dataclass(frozen=True)
class LoraTarget:
    """One adapted projection, e.g. layer 3's ``q_proj`` at ``model.layers.3.self_attn.q_proj``."""

    layer: int
    module: str
    in_features: int
    out_features: int

    @property
    def path(self) -> str:
        block = "self_attn" if self.module in ATTENTION_MODULES else "mlp"
        return f"model.layers.{self.layer}.{block}.{self.module}"


@dataclass(frozen=True)
class LoraLayout:
    """The adapters of one spec on one model architecture (Qwen2 / Llama-style decoders)."""

    targets: tuple[LoraTarget, ...]
    rank: int
    alpha: float
    num_layers: int

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    @property
    def target_modules(self) -> list[str]:
        return sorted({t.module for t in self.targets})

    @property
    def target_layers(self) -> list[int]:
        return sorted({t.layer for t in self.targets})

    def shapes(self) -> list[tuple[int, int]]:
        """Shape of every ES tensor, in order (A then B per target)."""
        out: list[tuple[int, int]] = []
        for t in self.targets:
            out += [(self.rank, t.in_features), (t.out_features, self.rank)]
        return out

    def pairs(
        self, tensors: Sequence[torch.Tensor]
    ) -> Iterator[tuple[LoraTarget, torch.Tensor, torch.Tensor]]:
        """Each target with its ``(A, B)`` out of ``tensors`` in layout order (one adapter's
        ``[r, in]``, ``[out, r]``, or stacked members' ``[M, r, in]``, ``[M, out, r]``)."""
        if len(tensors) != 2 * len(self.targets):
            raise ValueError(f"{len(tensors)} tensors for {len(self.targets)} targets (A, B each)")
        for k, target in enumerate(self.targets):
            yield target, tensors[2 * k], tensors[2 * k + 1]

    @staticmethod
    def is_b(index: int) -> bool:
        """Whether ES tensor ``index`` is a second factor ``B`` (else ``A``)."""
        return index % 2 == 1

    def numel(self) -> int:
        return sum(a * b for a, b in self.shapes())

    def peft_keys(self) -> list[str]:
        """PEFT state-dict key of every ES tensor, in order."""
        keys: list[str] = []
        for t in self.targets:
            base = f"base_model.model.{t.path}"
            keys += [f"{base}.lora_A.weight", f"{base}.lora_B.weight"]
        return keys

    @classmethod
    def from_hf_config(cls, config: Any, spec: LoraSpec) -> LoraLayout:
        """Layout for a transformers config (``hidden_size``, heads, ``intermediate_size``)."""
        hidden, layers = config.hidden_size, config.num_hidden_layers
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        inter = config.intermediate_size
        dims = {
            "q_proj": (hidden, heads * head_dim),
            "k_proj": (hidden, kv_heads * head_dim),
            "v_proj": (hidden, kv_heads * head_dim),
            "o_proj": (heads * head_dim, hidden),
            "gate_proj": (hidden, inter),
            "up_proj": (hidden, inter),
            "down_proj": (inter, hidden),
        }
        chosen = list(range(layers)) if spec.target_layers is None else sorted(spec.target_layers)
        if chosen[-1] >= layers:
            raise ConfigError(
                "target_layers",
                f"layer {chosen[-1]} does not exist: the model "
                f"has {layers} layers (0..{layers - 1})",
                "use indices below the model's num_hidden_layers, or null for all",
            )
        modules = [m for m in dims if m in spec.target_modules]  # canonical module order
        narrowest = min(modules, key=lambda m: min(dims[m]))
        if spec.rank > min(dims[narrowest]):
            raise ConfigError(
                "rank",
                f"{spec.rank} exceeds the model's smallest adapted dimension "
                f"{min(dims[narrowest])} ({narrowest}: {dims[narrowest][0]} -> "
                f"{dims[narrowest][1]}); a larger rank adds no expressiveness",
                f"set lora.rank <= {min(dims[narrowest])}",
            )
        targets = tuple(LoraTarget(layer, m, *dims[m]) for layer in chosen for m in modules)
        return cls(targets=targets, rank=spec.rank, alpha=spec.alpha, num_layers=layers)

    def init_mean(self, spec: LoraSpec, scales: Sequence[float], seed: int) -> list[torch.Tensor]:
        """The initial ES mean (fp32, CPU), drawn from ``torch.Generator().manual_seed(seed)``."""
        gen = torch.Generator().manual_seed(seed)
        return [
            spec.init_tensor(shape, is_b=self.is_b(i), scale=scales[i], generator=gen)
            for i, shape in enumerate(self.shapes())
        ]


@dataclass(frozen=True)
class LoraPopulation:
    """Adapters of M members as stacked tensors ``[M, *shape]`` in layout order."""

    layout: LoraLayout
    tensors: tuple[torch.Tensor, ...]

    def __len__(self) -> int:
        return self.tensors[0].shape[0]

    def member(self, i: int) -> list[torch.Tensor]:
        return [t[i] for t in self.tensors]

    def subset(self, members: Sequence[int]) -> LoraPopulation:
        """The population of ``members`` (indices, in that order)."""
        index = torch.tensor(list(members), dtype=torch.long)
        return LoraPopulation(
            self.layout, tuple(t.index_select(0, index.to(t.device)) for t in self.tensors)
        )

    @property
    def scaling(self) -> float:
        """``alpha / rank``: the factor every delta ``B A`` is multiplied by."""
        return self.layout.scaling

    def factors(self) -> Iterator[tuple[LoraTarget, torch.Tensor, torch.Tensor]]:
        """Each target with every member's factors ``A [M, r, in]`` and ``B [M, out, r]``."""
        return self.layout.pairs(self.tensors)

    @classmethod
    def single(cls, layout: LoraLayout, tensors: Sequence[torch.Tensor]) -> LoraPopulation:
        """A population of one (e.g. the ES mean for evaluation)."""
        return cls(layout, tuple(t.unsqueeze(0) for t in tensors))

    def extended(self, others: LoraPopulation) -> LoraPopulation:
        """This population's members, then ``others``' (cast to each tensor's dtype and
        device: member ``i < len(self)`` is unchanged, bit for bit)."""
        if len(others.tensors) != len(self.tensors):
            raise ValueError(f"{len(others.tensors)} tensors for {len(self.tensors)}")
        return LoraPopulation(
            self.layout,
            tuple(
                torch.cat([t, o.to(t.device, t.dtype)])
                for t, o in zip(self.tensors, others.tensors, strict=True)
            ),
        )
