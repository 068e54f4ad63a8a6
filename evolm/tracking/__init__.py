"""Tracking storage the callbacks (:mod:`evolm.callbacks`) and sweeps write through: the MLflow
store and its lock (:mod:`~evolm.tracking.store`), run info (:mod:`~evolm.tracking.runinfo`:
flattened config, git commit) and the evolution figure (:mod:`~evolm.tracking.plot`)."""
