"""Hyperparameter sweeps: ``python -m evolm -m hparams_search=es_optuna`` (README, "Sweeps").

- :mod:`evolm.sweep.callback`: the Hydra callback that checks the search space against the
  server, keeps one MLflow parent run per study (:mod:`evolm.sweep.parent_run`) and reports
  how many engines the sweep started;
- :mod:`evolm.sweep.study`: reads the Optuna study (trial counts, the best trial so far) and
  seeds the sampler of a resumed study or a parallel worker afresh.

Importing this package registers the ``${evolm_sweep_seed:SEED,WORKER}`` resolver.
"""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf


def _sweep_seed(seed: Any, worker: Any = 0) -> int:
    from evolm.sweep.study import sweep_seed

    return sweep_seed(int(seed), int(worker))


OmegaConf.register_resolver("evolm_sweep_seed", _sweep_seed, replace=True)
