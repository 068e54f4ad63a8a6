"""A lean Qwen2 / Llama decoder forward over an HF model's own weights: the engine's fast path.

HF's modules spend most of a population's time in decoding: per step, dozens of small kernels
per layer, a host sync, and a growing cache. This forward computes the same function with:

- fused projections (:class:`Proj`): q/k/v are one matmul and gate/up one. The fused weight
  buffers are built once and the HF modules' parameters are turned into *views* of them, so the
  weights are held once and an in-place edit through either path is seen by both (not by the
  fp8 copies of ``quantization=fp8``, :mod:`evolm.engine.fast.fp8`, made once);
- grouped LoRA (:mod:`evolm.engine.fast.lora`): on GPUs every member's first factors sit in spare
  rows of the projection's weight buffer, so one GEMM gives the base output and the rank-space
  activations of all members (with fp8 GEMMs, two: the fp8 base, the spare rows' own); the
  second products are applied inside the next kernel: RoPE for q/k/v, SiLU-and-multiply for
  gate/up, and the residual-add + RMSNorm that follows o and down
  (:mod:`evolm.engine.kernels.fused`). A LoRA layer then launches the same kernels as a base one;
- the residual stream is updated by the norm: ``h = rmsnorm(x += y + delta)``, where ``y`` is
  the o or down output (the "pending" add of the previous block);
- a static KV cache ``[layers, cache rows, kv_heads, positions, head_dim]``
  (:meth:`FastModel.new_cache`): prefill (last-position logits only) writes a row's prompt
  into its cache row; each decode step (:meth:`FastModel.decode_slots`) writes one position per
  row and attends over that row's own positions, so every step of a batch bucket has the same
  shapes and can be replayed as a CUDA graph (:mod:`evolm.engine.fast.runner`), whatever the
  rows' lengths (continuous batching: :mod:`evolm.engine.fast.scheduler`).

Decode attention treats the ``g = heads / kv_heads`` query heads that share a KV head as ``g``
query positions of that head: one SDPA call (on GPUs a Triton kernel) over the cache with no KV
expansion.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from evolm.engine.fast.lora import (
    FastLora,
    FastLoraRows,
    GroupLora,
    RankActs,
    lora_delta,
    operand,
)
from evolm.engine.fast.ops import Ops, default_mode
from evolm.engine.fast.weights import Proj, unsupported_reason
from evolm.engine.kernels import FP8_MAX

LoraLike = FastLora | FastLoraRows | None
Pending = tuple[Tensor, RankActs | None, GroupLora | None]
"""An o / down output not yet added to the residual: ``(y, u, its group)``."""


def _group(lora: LoraLike, layer: int, name: str) -> GroupLora | None:
    return None if lora is None else lora.get(layer, name)


def _pending(proj: Proj, x: Tensor, g: GroupLora | None) -> Pending:
    """The o / down projection of ``x``, held for the next residual add + RMSNorm."""
    y, u = proj.project(x, g)
    return y, u, g


@dataclass(frozen=True)
class FastLayer:
    ln1: Tensor
    ln2: Tensor
    qkv: Proj
    o: Proj
    gate_up: Proj
    down: Proj


@dataclass
class KVCache:
    """Static cache ``[layers, rows, kv_heads, slots, head_dim]`` for K and V."""

    k: Tensor
    v: Tensor


def to_cache(t: Tensor, cache: Tensor) -> Tensor:
    """``t`` in the cache's dtype; into an fp8 cache clamped to its range first, as the Triton
    kernels' saturating stores do (a cast alone gave NaN above ~464 in older torch)."""
    if cache.dtype == t.dtype:
        return t
    if cache.element_size() == 1:
        t = t.clamp(-FP8_MAX, FP8_MAX)
    return t.to(cache.dtype)


def prefill_mask(valid: Tensor, dtype: torch.dtype, past: int = 0) -> Tensor:
    """Additive ``[rows, 1, L - past, L]`` mask of the queries at positions ``past..L-1``:
    causal, no padded keys; each query sees itself, so the rows of padded positions stay finite
    (their outputs are never used)."""
    length = valid.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=valid.device).tril()[past:]
    eye = torch.eye(length, dtype=torch.bool, device=valid.device)[past:]
    allowed = (causal & valid[:, None, :]) | eye
    zero = torch.zeros((), dtype=dtype, device=valid.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]


class FastModel:
    """The fast forward of a Qwen2 / Llama ``*ForCausalLM`` (see the module docstring)."""

    def __init__(
        self, model: nn.Module, ops: str | None = None, decode_sdpa: str | None = None
    ) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the fast path does not support this model: {reason}")
        cfg, inner = model.config, model.model
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.hidden, self.inter = cfg.hidden_size, cfg.intermediate_size
        self.eps = cfg.rms_norm_eps
        self.q_out, self.kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.embed = inner.embed_tokens.weight
        self.norm = inner.norm.weight
        self.lm_head = model.get_output_embeddings()  # read at call time: tests edit its bias
        self.rotary = inner.rotary_emb
        self.layers = [self._layer(layer) for layer in inner.layers]
        self.ops = Ops(ops or default_mode(self.embed.device))
        self.decode_sdpa = decode_sdpa  # force SDPA (this backend) for decode attention
        self.weights_version = 0  # bumped when a weight buffer is reallocated (spare rows)

    def set_ops(self, mode: str) -> None:
        self.ops = Ops(mode)

    def _layer(self, layer: nn.Module) -> FastLayer:
        attn, mlp = layer.self_attn, layer.mlp
        return FastLayer(
            ln1=layer.input_layernorm.weight,
            ln2=layer.post_attention_layernorm.weight,
            qkv=Proj([attn.q_proj, attn.k_proj, attn.v_proj]),
            o=Proj([attn.o_proj]),
            gate_up=Proj([mlp.gate_proj, mlp.up_proj]),
            down=Proj([mlp.down_proj]),
        )

    def projections(self) -> list[Proj]:
        return [p for w in self.layers for p in (w.qkv, w.o, w.gate_up, w.down)]

    def weight_bytes(self) -> int:
        """Bytes of the embedding and the layers' projection weights, fp8 copies included (for
        memory budgets)."""
        projs = self.projections()
        fp8 = sum(p.fp8.nbytes for p in projs if p.fp8 is not None)
        return self.embed.nbytes + sum(p.weight.nbytes for p in projs) + fp8

    def quantize(self, on: bool = True) -> None:
        """fp8 copies of every projection's weights (``server.quantization=fp8``: see
        :mod:`evolm.engine.fast.fp8`), made from the current weights; ``on=False`` drops them
        (benchmarks). Bumps :attr:`weights_version`: workspaces and graphs captured before are
        rebuilt."""
        for p in self.projections():
            p.quantize(on)
        self.weights_version += 1

    @property
    def quantized(self) -> bool:
        return self.layers[0].qkv.fp8 is not None

    # -- shapes the grouped LoRA needs ---------------------------------------------------
    def lora_dims(self) -> tuple[dict[str, int], dict[str, tuple[int, ...]]]:
        ins = {"qkv": self.hidden, "o": self.q_out, "gate_up": self.hidden, "down": self.inter}
        outs = {
            "qkv": (self.q_out, self.kv_out, self.kv_out),
            "o": (self.hidden,),
            "gate_up": (self.inter, self.inter),
            "down": (self.hidden,),
        }
        return ins, outs

    def spare_rows(self, layer: int, group: str, rows: int) -> Tensor:
        """``rows`` spare rows of a projection's weight buffer (grown if needed, which bumps
        :attr:`weights_version`: views and CUDA graphs over the old buffer are stale)."""
        proj: Proj = getattr(self.layers[layer], group)
        if proj.reserve(rows):
            self.weights_version += 1
        return proj.spare_rows(rows)

    def new_cache(self, rows: int, slots: int, dtype: torch.dtype | None = None) -> KVCache:
        """A zeroed cache in ``dtype`` (None: the model's; ``torch.float8_e4m3fn``: an fp8
        cache, K/V rounded when written and widened when read)."""
        shape = (len(self.layers), rows, self.kv_heads, slots, self.head_dim)
        kw = {"dtype": dtype or self.embed.dtype, "device": self.embed.device}
        return KVCache(torch.zeros(shape, **kw), torch.zeros(shape, **kw))

    def rope_tables(self, slots: int) -> tuple[Tensor, Tensor]:
        """cos, sin ``[slots, head_dim]`` for positions ``0..slots-1`` (the model's own RoPE)."""
        positions = torch.arange(slots, device=self.embed.device)[None]
        cos, sin = self.rotary(self.embed[:1], positions)
        return cos[0], sin[0]

    def logits(self, h: Tensor, out: Tensor | None = None) -> Tensor:
        """LM-head logits ``[rows, vocab]`` of final-normed hidden states ``h``."""
        weight, bias = self.lm_head.weight, self.lm_head.bias
        if bias is not None:
            return torch.addmm(bias, h, weight.t(), out=out)
        return torch.mm(h, weight.t(), out=out)

    def greedy(self, h: Tensor, tokens: Tensor, scratch: Tensor) -> None:
        """Argmax of the logits of final-normed ``h [rows, hidden]`` into ``tokens [rows]``,
        ``len(scratch)`` rows at a time: the logits of all rows are never held at once."""
        for lo in range(0, h.shape[0], scratch.shape[0]):
            hi = min(h.shape[0], lo + scratch.shape[0])
            torch.argmax(self.logits(h[lo:hi], scratch[: hi - lo]), dim=-1, out=tokens[lo:hi])

    # -- one layer -----------------------------------------------------------------------
    def add_norm(self, x: Tensor, pending: Pending | None, weight: Tensor) -> Tensor:
        """``x += y + u Bt`` (the pending o / down output, in place), then RMSNorm of ``x``."""
        y, u, g = pending if pending is not None else (None, None, None)
        if self.ops.add_rms_norm is not None and self.hidden <= self.ops.norm_max_hidden:
            return self.ops.add_rms_norm(x, weight, self.eps, y, operand(u, g))
        if y is not None:
            x.add_(y)
        if u is not None and g is not None:
            x.add_(lora_delta(u, g))
        return F.rms_norm(x, (self.hidden,), weight, self.eps)

    def _mlp(self, i: int, w: FastLayer, h: Tensor, lora: LoraLike) -> Pending:
        g = _group(lora, i, "gate_up")
        base, u = w.gate_up.project(h, g)
        if self.ops.mode == "triton":  # the kernel adds u Bt itself
            act = self.ops.silu_mul(base, operand(u, g))
        else:
            act = self.ops.silu_mul(base if u is None else base + lora_delta(u, g))  # type: ignore[arg-type]
        return _pending(w.down, act, _group(lora, i, "down"))

    def _qkv(
        self,
        i: int,
        w: FastLayer,
        h: Tensor,
        lora: LoraLike,
        cos: Tensor,
        sin: Tensor,
        cache: tuple[Tensor, ...] | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """q ``[T, heads, hd]``, k and v ``[T, kv_heads, hd]`` (RoPE applied) for normed ``h``;
        ``cos``/``sin`` are ``[T, 1, hd]``. With ``cache = (k_cache, v_cache, slot)`` (decode)
        k and v are written at ``slot`` and come back as None."""
        g, tokens, rot = _group(lora, i, "qkv"), h.shape[0], self.heads + self.kv_heads
        base, u = w.qkv.project(h, g)
        if self.ops.qkv_rope is not None:  # the kernel adds u Bt itself
            qkv = base.view(tokens, -1, self.head_dim)
            out = self.ops.qkv_rope(qkv, cos, sin, rot, operand(u, g), cache)
            if cache is not None:
                return out[:, : self.heads], None, None
            return out[:, : self.heads], out[:, self.heads : rot], out[:, rot:]
        qkv = base if u is None else base + lora_delta(u, g)  # type: ignore[arg-type]
        qk = qkv[:, : self.q_out + self.kv_out].reshape(tokens, -1, self.head_dim)
        qk = self.ops.rope(qk, cos, sin)
        v = qkv[:, self.q_out + self.kv_out :].reshape(tokens, -1, self.head_dim)
        return qk[:, : self.heads], qk[:, self.heads :], v

    # -- prefill -------------------------------------------------------------------------
    def prefill(
        self,
        ids: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor | None,
        cache: KVCache,
        rows: slice | Tensor,
        lora: LoraLike,
        past: int = 0,
    ) -> Tensor:
        """Run prompts ``ids [r, L]`` (member-major, left-padded), write their K/V into cache
        rows ``rows`` slots ``0..L-1``; return last-position logits ``[r, vocab]``.

        ``cos``/``sin`` are ``[r, L, head_dim]`` at each token's position; ``mask`` is
        :func:`prefill_mask` (None when nothing is padded: plain causal attention).
        ``past``: the cache rows already hold the K/V of the prompts' first ``past`` positions
        (a shared prefix, :mod:`evolm.engine.fast.prefix`); ``ids`` are the positions after
        them, written at ``past..``, and their queries also attend over the cached ones
        (``mask``: :func:`prefill_mask` with ``past``)."""
        r, length = ids.shape
        x = F.embedding(ids, self.embed).view(r * length, self.hidden)
        cos, sin = cos.reshape(r * length, 1, -1), sin.reshape(r * length, 1, -1)
        pending: Pending | None = None
        for i, w in enumerate(self.layers):
            h = self.add_norm(x, pending, w.ln1)
            q, k, v = (
                t.view(r, length, -1, self.head_dim).transpose(1, 2)  # type: ignore[union-attr]
                for t in self._qkv(i, w, h, lora, cos, sin)
            )
            cache.k[i][rows, :, past : past + length] = to_cache(k, cache.k)
            cache.v[i][rows, :, past : past + length] = to_cache(v, cache.v)
            if past:  # the cached prefix's keys and values, as decode reads them
                k = torch.cat([cache.k[i][rows, :, :past].to(k.dtype), k], 2)
                v = torch.cat([cache.v[i][rows, :, :past].to(v.dtype), v], 2)
            attn = self._prefill_attention(q, k, v, mask)
            attn = attn.transpose(1, 2).reshape(r * length, self.q_out)
            h = self.add_norm(x, _pending(w.o, attn, _group(lora, i, "o")), w.ln2)
            pending = self._mlp(i, w, h, lora)
        h = self.add_norm(x, pending, self.norm)
        return self.logits(h.view(r, length, self.hidden)[:, -1])

    def _decode_backend(self) -> AbstractContextManager[None]:
        """``decode_sdpa``: None (torch's choice) or an SDPBackend name, e.g. ``"MATH"``."""
        if self.decode_sdpa is None:
            return nullcontext()
        return sdpa_kernel(getattr(SDPBackend, self.decode_sdpa))

    def _prefill_attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    # -- decode --------------------------------------------------------------------------
    def decode_slots(
        self,
        tokens: Tensor,
        cos: Tensor,
        sin: Tensor,
        sel: Tensor,
        pos: Tensor,
        lo: Tensor,
        cache: KVCache,
        lora: LoraLike,
        span: int = 1,
    ) -> Tensor:
        """One token per row for continuous batching: row ``b`` lives in cache row ``sel[b]``,
        writes its K/V at position ``pos[b]`` and attends over positions ``lo[b]..pos[b]``
        (its own prompt and completion, whatever the other rows' lengths). ``lora``: per-row
        members (:meth:`FastLora.rows`). ``span``: rows come in runs of ``span`` consecutive
        positions of one slot (verify rows; the last ones may be capped at the slot's last
        position, equal), whose attention reads the slot once for several
        rows (the slot attention kernel; each row's result bit-equal). Returns the
        final-normed hidden states. No host sync."""
        rows = tokens.shape[0]
        group = self.heads // self.kv_heads
        x = F.embedding(tokens, self.embed)
        cos, sin = cos[:, None], sin[:, None]
        hi = pos + 1
        bias4 = None
        width = cache.k.shape[3]
        if self.ops.slot_attention is None or self.decode_sdpa is not None:
            if tokens.device.type == "cpu":  # no graphs here: read only the filled positions
                width = int(hi.max())
            cols = torch.arange(width, device=tokens.device)
            allowed = (cols >= lo[:, None]) & (cols < hi[:, None])
            neg = torch.finfo(x.dtype).min
            bias4 = torch.where(allowed, 0.0, neg).to(x.dtype)[:, None, None]
        pending: Pending | None = None
        for i, w in enumerate(self.layers):
            h = self.add_norm(x, pending, w.ln1)
            q, k, v = self._qkv(i, w, h, lora, cos, sin, (cache.k[i], cache.v[i], sel, pos))
            if k is not None and v is not None:  # not written by the fused kernel
                cache.k[i][sel, :, pos] = to_cache(k, cache.k)
                cache.v[i][sel, :, pos] = to_cache(v, cache.v)
            q = q.reshape(rows, self.kv_heads, group, self.head_dim)
            if bias4 is None:
                attn = self.ops.slot_attention(q, cache.k[i], cache.v[i], sel, lo, hi, span=span)  # type: ignore[misc]
            else:
                with self._decode_backend():
                    kc, vc = cache.k[i][sel, :, :width], cache.v[i][sel, :, :width]
                    kc, vc = kc.to(q.dtype), vc.to(q.dtype)  # an fp8 cache is widened to read
                    attn = F.scaled_dot_product_attention(q, kc, vc, attn_mask=bias4)
            attn = attn.reshape(rows, self.q_out)
            h = self.add_norm(x, _pending(w.o, attn, _group(lora, i, "o")), w.ln2)
            pending = self._mlp(i, w, h, lora)
        return self.add_norm(x, pending, self.norm)
