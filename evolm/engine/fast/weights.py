"""The fast path's view of an HF model's weights: what it supports, and fused projections."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from evolm.engine.fast.fp8 import Fp8Weight
from evolm.engine.fast.lora import GroupLora, RankActs, project


def base_linear(module: nn.Module) -> nn.Linear:
    """The ``nn.Linear`` itself, or the one a wrapper holds as ``base`` (the HF path's
    MultiLoraLinear, not imported: the fast path does not depend on the HF path)."""
    base = getattr(module, "base", None)
    return base if isinstance(base, nn.Linear) else module  # type: ignore[return-value]


def unsupported_reason(model: nn.Module) -> str | None:
    """Why the fast path cannot run ``model`` (None: it can)."""
    cfg = model.config
    if cfg.model_type not in ("qwen2", "llama"):
        return f"model_type {cfg.model_type!r} (supported: qwen2, llama)"
    if getattr(cfg, "use_sliding_window", False):
        return "sliding-window attention"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r}"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope.get("rope_type", "default") in ("dynamic", "longrope"):
        return f"position-dependent RoPE {rope['rope_type']!r}"
    layer = model.model.layers[0]
    if base_linear(layer.self_attn.o_proj).bias is not None:
        return "o_proj bias"
    if any(base_linear(getattr(layer.mlp, m)).bias is not None for m in ("gate_proj", "down_proj")):
        return "MLP bias"
    return None


def fuse(modules: list[nn.Module], spare: int = 0) -> tuple[Tensor, Tensor | None]:
    """One weight (and bias) buffer for ``modules``, with at least ``spare`` zero rows after
    theirs (for LoRA first factors); their parameters become views of it. An existing buffer
    with enough spare rows is reused; a new one copies the weights from the current views."""
    linears = [base_linear(m) for m in modules]
    out = sum(lin.out_features for lin in linears)
    cached = getattr(modules[0], "_evolm_fused", None)
    if (
        cached is not None
        and cached[0].shape[0] >= out + spare
        and cached[0].data_ptr() == linears[0].weight.data_ptr()
    ):
        return cached
    first = linears[0].weight
    extra = first.new_zeros(spare, first.shape[1])
    weight = torch.cat([lin.weight.data for lin in linears] + [extra])
    biases = [lin.bias for lin in linears]
    bias = None
    if biases[0] is not None:
        bias = torch.cat([b.data for b in biases] + [biases[0].new_zeros(spare)])  # type: ignore[union-attr]
    off = 0
    for lin in linears:
        n = lin.out_features
        lin.weight.data = weight[off : off + n]
        if bias is not None:
            lin.bias.data = bias[off : off + n]
        off += n
    modules[0]._evolm_fused = (weight, bias)
    return weight, bias


class Proj:
    """A fused projection over ``modules``: ``weight [out + spare, in]`` (and ``bias``), whose
    first ``out`` rows are the modules' weights (their parameters are views) and whose spare
    rows hold LoRA first factors (see :mod:`evolm.engine.fast.lora`)."""

    def __init__(self, modules: list[nn.Module]) -> None:
        self.modules = modules
        self.weight, self.bias = fuse(modules)  # may be an earlier buffer with spare rows
        self.out = sum(base_linear(m).out_features for m in modules)
        self.fp8: Fp8Weight | None = None  # the base weights' fp8 copy (quantization=fp8)

    def quantize(self, on: bool = True) -> None:
        """Make (or remake, from the current weights) the fp8 copy the base product uses;
        ``on=False``: drop it."""
        self.fp8 = Fp8Weight.quantize(self.weight[: self.out]) if on else None

    def reserve(self, spare: int) -> bool:
        """At least ``spare`` spare rows; True when the buffer had to be reallocated."""
        if self.weight.shape[0] - self.out >= spare:
            return False
        self.weight, self.bias = fuse(self.modules, spare)
        return True

    def spare_rows(self, rows: int) -> Tensor:
        return self.weight[self.out : self.out + rows]

    def project(self, x: Tensor, lora: GroupLora | None) -> tuple[Tensor, RankActs | None]:
        """``(bias + x W^T, u)``: see :func:`evolm.engine.fast.lora.project`."""
        return project(x, self.weight, self.bias, self.out, lora, self.fp8)


@torch.no_grad()
def update_weights(model: nn.Module, named: Mapping[str, Tensor]) -> list[nn.Module]:
    """Copy ``named`` (parameter name -> tensor, any dtype: rounded once to the parameter's)
    into ``model``'s projection weights IN PLACE, through :class:`MultiLoraLinear` wrappers;
    returns the base linears changed. The fast path's fused buffers see the change at once (the
    modules' parameters are views of them), so CUDA graphs captured over them stay valid."""
    changed = []
    for name, value in named.items():
        path, _, leaf = name.rpartition(".")
        if leaf != "weight":
            raise KeyError(f"{name}: only projection weights (.weight) can be updated")
        module = model.get_submodule(path)
        param = base_linear(module).weight
        if tuple(param.shape) != tuple(value.shape):
            raise ValueError(
                f"{name}: shape {tuple(value.shape)}, the model's {tuple(param.shape)}"
            )
        param.data.copy_(value)
        changed.append(base_linear(module))
    return changed


@torch.no_grad()
def refresh_fp8(projs: list[Proj]) -> None:
    """Requantize the fp8 copies (``quantization=fp8``) of ``projs`` from their current weights,
    IN PLACE (the same tensors: CUDA graphs that read them stay valid)."""
    for p in projs:
        if p.fp8 is None:
            continue
        fresh = Fp8Weight.quantize(p.weight[: p.out])
        p.fp8.weight.copy_(fresh.weight)
        p.fp8.scale.copy_(fresh.scale)
