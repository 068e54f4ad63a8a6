"""The one error type for bad input: it names the config key (or file) and the fix."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad configuration or input, raised before any model loads.

    ``key`` is the config key relative to its node (``"sigma"``); the composition root prefixes
    the group (``"es.sigma"``) so the user sees exactly what to change.
    """

    def __init__(self, key: str, problem: str, fix: str) -> None:
        self.key = key
        self.problem = problem
        self.fix = fix
        super().__init__(f"{key}: {problem}. Fix: {fix}")

    def in_group(self, group: str) -> ConfigError:
        """The same error with the key qualified by its config group."""
        return ConfigError(f"{group}.{self.key}", self.problem, self.fix)


class RunAborted(RuntimeError):
    """A run stopped on purpose because it cannot go on usefully (e.g. it cannot learn); the
    message says why and what to change."""


class ServiceUnavailable(RuntimeError):
    """A service the run needs (the scorer, a generation server) gave no answer after its
    bounded retries. The message names the service, the key that points at it and how to start
    it; the run's checkpoints stay, so ``resume=<run dir>`` continues it once the service is up."""
