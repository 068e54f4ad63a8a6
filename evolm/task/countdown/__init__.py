"""``task=countdown`` (the paper's main task): the task (:mod:`.task`), its reward and prompt
(:mod:`.reward`), the puzzle data and generators (:mod:`.data`, :mod:`.sources`,
:mod:`.solver`), the shortcut-aware metrics (:mod:`.shortcuts`, :mod:`.summary`), the tiny
model's warm-up data (:mod:`.warmup`) and ``python -m evolm.task.countdown.stats``."""

from evolm.task.countdown.task import ASSISTANT_PREFIX, SYSTEM_PROMPT, Countdown

__all__ = ["ASSISTANT_PREFIX", "SYSTEM_PROMPT", "Countdown"]
