"""The command line's pieces besides the Hydra app itself (``evolm/__main__.py``, where
``python -m evolm`` must live):

- :mod:`.rundir`: the run directory a command's run claims and locks (a Hydra callback, and
  the ``${evolm.run_dir:...}`` resolver's claim);
- :mod:`.export`: ``python -m evolm.export`` (a run's adapter merged into its base; the command
  keeps its name through the ``evolm/export.py`` entry point).

Nothing is imported here.
"""
