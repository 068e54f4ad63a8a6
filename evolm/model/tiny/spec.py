"""The tiny model's spec: :class:`TinyModel`, a cheap frozen config object that builds the model
(:mod:`evolm.model.tiny.build`, offline, deterministically) into the model cache
(:mod:`evolm.model.cache`) on first ``resolve()``.

Constructing it loads nothing: the corpus (pure Python) is read when the cache key is computed,
torch, tokenizers and transformers only when the model is built.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from evolm.errors import ConfigError
from evolm.model.cache import build_atomically, cache_root, is_built

if TYPE_CHECKING:
    from evolm.model.tiny.warmup import WarmupData

logger = logging.getLogger(__name__)

# Bump when the builder's output changes for the same spec: old cache entries are then ignored.
# 4: built with pinned CPU kernels (.pinned); 5: MKL's COMPATIBLE branch; 6: the fused AdamW
# (the same bytes on Intel and AMD)
TINY_BUILD_VERSION = 6
MIN_HEAD_DIM = 32  # vLLM's CPU attention rejects smaller heads at the first request.
MIN_VOCAB_SIZE = 512  # 256 byte-level symbols + 3 special tokens + room for merges.


@dataclass(frozen=True)
class TinyModel:
    """A tiny Qwen2-architecture model with a trained byte-level BPE tokenizer.

    Random weights followed by ``warmup_steps`` AdamW steps on built-in question/answer text
    (0 keeps the pure random weights): the result answers verbosely, then stops, which gives the
    conciseness demo something to learn.

    Built offline in a few seconds on first ``resolve()`` and cached under
    ``<cache_dir>/models/tiny-<hash>``; the same fields always give byte-identical files.
    ``vocab_size`` is the embedding size and the BPE target (the built-in corpus reaches it for
    the default 2048; a larger value leaves unused embedding rows, as Qwen's checkpoints do).
    """

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    vocab_size: int = 2048
    max_position_embeddings: int = 1024
    seed: int = 0
    warmup_steps: int = 200
    countdown_share: float = 0.0
    countdown_untagged: float = 0.0
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        for key in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size"):
            if getattr(self, key) < 1:
                raise ConfigError(key, f"must be positive, got {getattr(self, key)}", "set >= 1")
        self._check_heads()
        if self.warmup_steps < 0:
            raise ConfigError(
                "warmup_steps",
                f"must be >= 0, got {self.warmup_steps}",
                "use 0 for pure random weights",
            )
        if not 0.0 <= self.countdown_share <= 1.0:
            raise ConfigError(
                "countdown_share",
                f"must be in [0, 1], got {self.countdown_share}",
                "e.g. 0.5 (half the warm-up steps on countdown), 0 for none",
            )
        if not 0.0 <= self.countdown_untagged < 1.0:
            raise ConfigError(
                "countdown_untagged",
                f"must be in [0, 1), got {self.countdown_untagged}",
                "e.g. 0.5 (half the warm-up answers without <answer> tags), 0 for none",
            )
        if self.vocab_size < MIN_VOCAB_SIZE:
            raise ConfigError(
                "vocab_size", f"{self.vocab_size} is too small", f"set >= {MIN_VOCAB_SIZE}"
            )
        if self.max_position_embeddings < 16:
            raise ConfigError(
                "max_position_embeddings",
                f"{self.max_position_embeddings} is too small",
                "set >= 16",
            )

    def _check_heads(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                "num_heads",
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}",
                "choose num_heads that divides hidden_size",
            )
        head_dim = self.hidden_size // self.num_heads
        if head_dim < MIN_HEAD_DIM:
            raise ConfigError(
                "num_heads",
                f"head_dim = hidden_size / num_heads = {self.hidden_size}/{self.num_heads} "
                f"= {head_dim} < {MIN_HEAD_DIM} (vLLM's CPU attention rejects it)",
                f"lower num_heads or raise hidden_size so that head_dim >= {MIN_HEAD_DIM}",
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                "num_kv_heads",
                f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.num_kv_heads}",
                "choose num_kv_heads that divides num_heads",
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def fingerprint(self, warmup: WarmupData | None = None) -> str:
        """A short hash of everything the build reads: every field that shapes the files (all
        but ``cache_dir``), the built-in corpus and, with ``countdown_share``, the warm-up
        data's :meth:`~evolm.model.tiny.warmup.WarmupData.fingerprint` (a changed countdown prompt
        builds a new model instead of reusing a stale one)."""
        fields: dict[str, object] = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self)
        }
        del fields["cache_dir"]
        for key in ("countdown_share", "countdown_untagged"):
            if not fields[key]:  # unused: the same files (and hash) as before the key existed
                del fields[key]
        fields["build_version"] = TINY_BUILD_VERSION
        fields["corpus"] = corpus_digest()
        if self.countdown_share:
            fields["warmup"] = self._warmup(warmup).fingerprint()
        blob = json.dumps(fields, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def _warmup(self, warmup: WarmupData | None) -> WarmupData:
        if warmup is None:
            raise ValueError(
                f"TinyModel(countdown_share={self.countdown_share}) trains on countdown warm-up "
                "data that evolm.model does not own: pass warmup=CountdownWarmup() "
                "(evolm.task.countdown.warmup) to fingerprint/model_dir/resolve, as the "
                "composition root (evolm.app.build.resolve_model) does"
            )
        return warmup

    def cache_root(self) -> Path:
        return cache_root(self.cache_dir)

    def model_dir(self, warmup: WarmupData | None = None) -> Path:
        """Where this spec's model lives (it may not be built yet); ``warmup``: the countdown
        warm-up data, needed when ``countdown_share > 0``."""
        return self.cache_root() / "models" / f"tiny-{self.fingerprint(warmup)}"

    def resolve(self, warmup: WarmupData | None = None) -> str:
        """The model directory, built on first use (atomically; safe across processes);
        ``warmup``: the countdown warm-up data, needed when ``countdown_share > 0``."""
        target = self.model_dir(warmup)
        if not is_built(target):
            logger.info(
                "building the tiny model %s (%d warm-up steps; once: later runs load it)",
                target,
                self.warmup_steps,
            )
            build_atomically(target, lambda tmp: _build_tiny(self, tmp, warmup))
        return str(target)


def corpus_digest() -> str:
    """A hash of the built-in corpus the tokenizer and the question/answer warm-up read."""
    from evolm.model.tiny.corpus import build_corpus  # pure Python; 0.1 s

    return hashlib.sha256("\n".join(build_corpus(0)).encode()).hexdigest()[:16]


def _build_tiny(spec: TinyModel, out: Path, warmup: WarmupData | None) -> None:
    from evolm.model.tiny.pinned import build_pinned  # heavy imports only when building

    build_pinned(out, spec, warmup)
