"""Model specs (cheap config objects) and the one loader for causal LMs.

Importing this package loads neither torch nor transformers; ``resolve()`` and
``load_causal_lm`` import them when called.
"""

from __future__ import annotations

from evolm.model.gguf import GGUFModel, SmolLM2Model
from evolm.model.loading import load_causal_lm
from evolm.model.spec import HubModel, ModelSpec
from evolm.model.tiny import TinyModel

__all__ = [
    "GGUFModel",
    "HubModel",
    "ModelSpec",
    "SmolLM2Model",
    "TinyModel",
    "load_causal_lm",
]
