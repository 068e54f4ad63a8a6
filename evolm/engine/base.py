"""The Engine protocol: evaluate a whole population of LoRA adapters in one go.

Every engine, in-process (:mod:`evolm.engine.local`) or a client of a remote server
(:mod:`evolm.server`), subclasses :class:`Engine`: the three required methods have no default,
the optional hooks (:attr:`Engine.last_timings`, :meth:`Engine.use_layout`) have no-op ones, so
callers use them without probing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from evolm.lora.layout import LoraLayout, LoraPopulation
from evolm.sampling import Sampling


class Engine(Protocol):
    """Generates completions for every (member, prompt) pair of a population.

    ``generate`` returns ``out[m][p]``: member ``m``'s completion (text only, no prompt) for
    ``prompts[p]``. ``adapters=None`` means the base model alone (one "member").
    """

    layout: LoraLayout

    def format_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        """Render chat messages with the model's chat template, ending in the assistant header."""
        ...

    def generate(
        self, prompts: Sequence[str], adapters: LoraPopulation | None, sampling: Sampling, seed: int
    ) -> list[list[str]]: ...

    def close(self) -> None: ...

    # -- optional hooks (no-op defaults) ----------------------------------------------------
    @property
    def last_timings(self) -> Mapping[str, float]:
        """Seconds (or counts) of the last ``generate``'s phases, logged as ``time/engine_*``."""
        return {}

    def use_layout(self, layout: LoraLayout) -> None:
        """Serve adapters of ``layout`` from now on (a sweep trial reusing this engine with
        another rank or targets; see :mod:`evolm.server.pool`). Raise a ConfigError naming the
        ``server`` key to change when the engine cannot."""
        self.layout = layout


def chat_prompt(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> str:
    """Chat messages rendered with the tokenizer's chat template, ending in the assistant
    header: what every engine's ``format_chat`` returns."""
    return tokenizer.apply_chat_template(
        [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
    )
