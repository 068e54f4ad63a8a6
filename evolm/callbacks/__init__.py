"""Callbacks: the protocol (:mod:`evolm.callbacks.base`), the typed record every callback gets
(:mod:`evolm.callbacks.record`), and the built-in callbacks the ``callbacks`` and ``logger``
config groups name:

- :mod:`~evolm.callbacks.progress` (``ProgressBar``), :mod:`~evolm.callbacks.results`
  (``ResultsWriter``: ``results.jsonl``), :mod:`~evolm.callbacks.plot` (``EvolutionPlot``),
  :mod:`~evolm.callbacks.samples` (``SampleWriter``), :mod:`~evolm.callbacks.checkpoint`
  (``Checkpointer``), :mod:`~evolm.callbacks.health` (``LearningMonitor``),
  :mod:`~evolm.callbacks.adapter` (``AdapterWriter``, always added by the composition root;
  with ``es.mean=full`` :mod:`~evolm.callbacks.model`'s ``ModelWriter``; both write the best
  evaluation's mean too with ``keep_best``: :mod:`~evolm.callbacks.writer`);
- :mod:`~evolm.callbacks.mlflow` (``MLflowLogger``, the ``logger=mlflow`` group).

Storage they use lives apart: :mod:`evolm.tracking` (the MLflow store, run info, the figure),
:mod:`evolm.checkpoint` (the checkpoint format). Importing this package loads only the protocol.
"""

from __future__ import annotations

from evolm.callbacks.base import Callback, RunContext, Sample, Stateful, latest_eval
from evolm.callbacks.record import GenerationRecord, Record

__all__ = [
    "Callback",
    "GenerationRecord",
    "Record",
    "RunContext",
    "Sample",
    "Stateful",
    "latest_eval",
]
