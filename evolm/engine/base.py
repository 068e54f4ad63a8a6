"""The Engine protocol: evaluate a whole population of LoRA adapters in one go."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from evolm.lora.layout import LoraPopulation
from evolm.sampling import Sampling


@runtime_checkable
class Engine(Protocol):
    """Generates completions for every (member, prompt) pair of a population.

    ``generate`` returns ``out[m][p]``: member ``m``'s completion (text only, no prompt) for
    ``prompts[p]``. ``adapters=None`` means the base model alone (one "member").
    """

    def format_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        """Render chat messages with the model's chat template, ending in the assistant header."""
        ...

    def generate(
        self, prompts: Sequence[str], adapters: LoraPopulation | None, sampling: Sampling, seed: int
    ) -> list[list[str]]: ...

    def close(self) -> None: ...


def chat_prompt(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> str:
    """Chat messages rendered with the tokenizer's chat template, ending in the assistant
    header: what every engine's ``format_chat`` returns."""
    return tokenizer.apply_chat_template(
        [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
    )
