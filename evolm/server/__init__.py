"""Engines that evaluate populations: ``local`` (in-process), and persistent servers."""

from evolm.server.base import Engine

__all__ = ["Engine"]
