"""``model=tiny``: a tiny Qwen2-architecture model built offline, deterministically, in seconds.

The spec (:mod:`.spec`, :class:`TinyModel`) is all this package imports: building the model
(:mod:`.build`) trains a byte-level BPE tokenizer (:mod:`.tokenizer`) on the built-in corpus
(:mod:`.corpus`) and warms the random weights up (:mod:`.pretrain`, on the corpus and on
warm-up data passed in from above, :mod:`.warmup`; its time left: :mod:`.eta`), in a process
of its own whose CPU kernels are pinned (:mod:`.pinned`: the same bytes on every x86-64 machine
with AVX2, Intel or AMD).
Those modules, and torch, tokenizers and transformers, are imported only when a model is built.
"""

from evolm.model.tiny.spec import TinyModel

__all__ = ["TinyModel"]
