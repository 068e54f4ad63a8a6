"""Checks a run makes before it starts, each refusing with one :class:`~evolm.errors.ConfigError`
instead of failing later (or silently):

- :mod:`.compose_check`: the command line, composed before Hydra runs it (a misspelt key or an
  unknown option names the valid choices);
- :mod:`.trust`: the ``_target_`` s a config may name (the trust boundary, docs/security.md),
  and the ones that moved;
- :mod:`.limits`: memory and context, before the model loads (knows the Engine and Task
  protocols);
- :mod:`.agreement`: every rank composed the same run and read the same data; a resume reads
  the data its checkpoint was trained on.

Nothing is imported here: each check is imported where it is made (``evolm.__main__``,
``evolm.app``).
"""
