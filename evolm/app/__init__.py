"""The composition root: the only code that reads the config.

:func:`~evolm.app.run.train` (``evolm.app.run``) checks the config and builds the cheap parts
(``evolm.app.checks``, ``evolm.app.build``; bad input fails before any model loads), restores
a resumed run (``evolm.app.resume``), picks what ES moves (``evolm.app.modes``: the one place
that reads ``es.mean``), wires an :class:`~evolm.loop.ESLoop` and returns the metric a sweeper
optimises.
"""

from evolm.app.run import train

__all__ = ["train"]
