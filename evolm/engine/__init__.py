"""Engines that evaluate populations: the :class:`Engine` protocol and the in-process engine.

- :mod:`evolm.engine.local`: ``server=local``, one model in this process;
- :mod:`evolm.engine.hf`: its eager path over the transformers modules (any architecture);
- :mod:`evolm.engine.fast`: its fast path (fused projections, static KV cache, CUDA graphs);
- :mod:`evolm.engine.kernels`: the fast path's Triton kernels (the only package that needs
  ``triton``).

Clients of persistent servers (SGLang, vLLM) live in :mod:`evolm.server`.
"""

from evolm.engine.base import Engine

__all__ = ["Engine"]
