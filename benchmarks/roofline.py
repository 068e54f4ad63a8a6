"""The floor under one population evaluation: FLOPs over peak rate, bytes over bandwidth.

Counted per phase. Prefill: every prompt token through every layer's projections (LoRA
included), causal attention, and the LM head for the last position only. Decode: ``new - 1``
steps (the last sampled token needs no forward), each a full pass of every row through the
projections and the LM head, plus attention over the tokens so far; its bytes are the weights
read once, the KV cache read, the new K/V and the logits written. A step's floor is the larger
of its compute and memory times; the generation's floor is the sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Dense bf16 matrix rate and device-to-device bandwidth measured on this workplace's machines
# (docs/environment.md, /work/.library/device/KINDS.md).
PEAKS = {"H100": (790e12, 3.0e12), "H200": (790e12, 4.3e12)}


def device_peaks(device: torch.device) -> tuple[str, float, float] | None:
    """(name, FLOP/s, bytes/s) of a known GPU, else None."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, (flops, bw) in PEAKS.items():
        if key in name:
            return name, flops, bw
    return None


@dataclass(frozen=True)
class Dims:
    layers: int
    hidden: int
    inter: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def from_config(cls, cfg: object) -> Dims:
        heads = cfg.num_attention_heads  # type: ignore[attr-defined]
        hidden = cfg.hidden_size  # type: ignore[attr-defined]
        return cls(
            layers=cfg.num_hidden_layers,  # type: ignore[attr-defined]
            hidden=hidden,
            inter=cfg.intermediate_size,  # type: ignore[attr-defined]
            heads=heads,
            kv_heads=cfg.num_key_value_heads,  # type: ignore[attr-defined]
            head_dim=getattr(cfg, "head_dim", None) or hidden // heads,
            vocab=cfg.vocab_size,  # type: ignore[attr-defined]
        )

    @property
    def layer_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.inter

    def lora_params(self, rank: int) -> int:
        """Per layer, all 7 projections: ``r * (in + out)`` each."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        io = [(self.hidden, q), (self.hidden, kv), (self.hidden, kv), (q, self.hidden)]
        io += [(self.hidden, self.inter)] * 2 + [(self.inter, self.hidden)]
        return sum(rank * (i + o) for i, o in io)

    def kv_bytes_per_token(self, itemsize: int) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * itemsize


def floor(
    dims: Dims,
    rows: int,
    prompt_len: int,
    new_tokens: int,
    rank: int,
    peak_flops: float,
    bandwidth: float,
    itemsize: int = 2,
) -> dict[str, float]:
    """Seconds: ``compute_s``, ``memory_s`` (each phase's FLOPs or bytes alone) and ``floor_s``
    (per-phase max, summed), plus the counts."""
    d, tokens = dims, rows * prompt_len
    proj = d.layers * (d.layer_params + (d.lora_params(rank) if rank else 0))
    head = d.vocab * d.hidden
    attn_unit = 4 * d.heads * d.head_dim * d.layers  # FLOPs per (query, key) pair
    pre_flops = 2 * tokens * proj + attn_unit * rows * prompt_len * (prompt_len + 1) / 2
    pre_flops += 2 * rows * head
    weights = (proj + head) * itemsize
    pre_bytes = weights + tokens * d.kv_bytes_per_token(itemsize)
    result = {"prefill_flops": pre_flops, "prefill_bytes": float(pre_bytes)}
    compute, memory = pre_flops / peak_flops, pre_bytes / bandwidth
    total = max(compute, memory)
    dec_flops = dec_bytes = 0.0
    for t in range(1, new_tokens):
        context = prompt_len + t
        f = 2 * rows * (proj + head) + attn_unit * rows * context
        b = weights + rows * (context * d.kv_bytes_per_token(itemsize) + d.vocab * itemsize)
        dec_flops, dec_bytes = dec_flops + f, dec_bytes + b
        total += max(f / peak_flops, b / bandwidth)
    result.update(decode_flops=dec_flops, decode_bytes=dec_bytes)
    result["compute_s"] = compute + dec_flops / peak_flops
    result["memory_s"] = memory + dec_bytes / bandwidth
    result["floor_s"] = total
    return result
