"""How completions are generated: shared by tasks (which choose it) and engines (which obey it).

A leaf module: it imports nothing from evolm but :mod:`evolm.errors`, so engines need not
import any task to read their sampling settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from evolm.errors import ConfigError


@dataclass(frozen=True)
class Sampling:
    """How completions are generated: greedy when ``temperature == 0``."""

    max_new_tokens: int = 100
    temperature: float = 0.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(
                "max_new_tokens",
                f"must be >= 1, got {self.max_new_tokens}",
                "set it to the longest completion you need, e.g. 100",
            )
        if self.temperature < 0:
            raise ConfigError(
                "temperature",
                f"must be >= 0, got {self.temperature}",
                "use 0 for greedy decoding or a positive value to sample",
            )
        if not 0 < self.top_p <= 1:
            raise ConfigError("top_p", f"must be in (0, 1], got {self.top_p}", "use 1.0 to disable")
