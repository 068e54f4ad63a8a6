"""Engines that evaluate populations: ``local`` (in-process), and persistent servers."""

from evolm.engine.base import Engine

__all__ = ["Engine"]
