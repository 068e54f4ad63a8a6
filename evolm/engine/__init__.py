"""Engines that evaluate populations: the :class:`Engine` protocol and the in-process engine.

- :mod:`evolm.engine.base`: the :class:`Engine` protocol every engine implements;
- :mod:`evolm.engine.local`: ``server=local``, one model in this process; its settings are
  :class:`~evolm.engine.options.LocalOptions` (:mod:`evolm.engine.options`); it picks one of
  its two paths once (:mod:`evolm.engine.backend`) and forwards to it;
- :mod:`evolm.engine.fast`: its fast path (scheduler, runner, workspace, memory plan; the
  fused forward and CUDA graphs);
- :mod:`evolm.engine.hf`: its eager path over the transformers modules (any architecture);
- :mod:`evolm.engine.texts`: token ids <-> texts and stop strings, shared by both paths;
- :mod:`evolm.engine.sampler`: token choice, shared by both paths;
- :mod:`evolm.engine.kernels`: the fast path's Triton kernels (the only package that needs
  ``triton``);
- :mod:`evolm.app.pool`: one persistent engine per process (a sweep's trials share it).

Clients of persistent servers (SGLang, vLLM) live in :mod:`evolm.server`.
"""

from evolm.engine.base import Engine

__all__ = ["Engine"]
