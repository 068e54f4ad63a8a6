"""Tasks: prompts and rewards. See :class:`evolm.task.base.Task`."""

from evolm.task.base import Example, Sampling, Scores, Task

__all__ = ["Example", "Sampling", "Scores", "Task"]
