"""How completions are generated: shared by tasks (which choose it) and engines (which obey it).

A leaf module: it imports nothing from evolm but :mod:`evolm.errors`, so engines need not
import any task to read their sampling settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from evolm.errors import ConfigError

MAX_STOPS = 8
"""At most this many stop strings (each at most :data:`MAX_STOP_CHARS` characters)."""
MAX_STOP_CHARS = 64


@dataclass(frozen=True)
class Sampling:
    """How completions are generated: greedy when ``temperature == 0``.

    ``stop``: stop strings. A completion ends right after the first occurrence of any of them
    in its text, the stop string included (``"... </answer>"``), as it would end at an EOS;
    every engine returns exactly that text (:func:`cut_at_stop`). Empty: no stop strings.
    """

    max_new_tokens: int = 100
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()

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
        if isinstance(self.stop, str) or not all(isinstance(s, str) for s in self.stop):
            raise ConfigError(
                "stop", f"must be a list of strings, got {self.stop!r}", "e.g. stop: ['</answer>']"
            )
        object.__setattr__(self, "stop", tuple(self.stop))
        if len(self.stop) > MAX_STOPS or not all(0 < len(s) <= MAX_STOP_CHARS for s in self.stop):
            raise ConfigError(
                "stop",
                f"at most {MAX_STOPS} non-empty strings of at most {MAX_STOP_CHARS} characters, "
                f"got {list(self.stop)!r}",
                "e.g. stop: ['</answer>']",
            )


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` up to the earliest end of a stop string in it (the stop string included: where a
    generation that checks after every token would have stopped), and whether one occurs."""
    best = -1
    for s in stop:
        at = text.find(s)
        if at >= 0 and (best < 0 or at + len(s) < best):
            best = at + len(s)
    return (text, False) if best < 0 else (text[:best], True)
