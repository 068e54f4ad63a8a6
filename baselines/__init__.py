"""Baselines that evolm's ES is measured against (top level, not shipped, like ``benchmarks/``).

- ``python -m baselines.grpo``: GRPO with TRL's ``GRPOTrainer`` and a peft LoRA of evolm's
  layout, on evolm's task objects, writing evolm's ``results.jsonl`` keys
  (:mod:`baselines.grpo`);
- ``python -m baselines.compare``: ES (``python -m evolm``) and GRPO from the same model, on the
  same puzzles, for the same training time, evaluated alike at the same training-time marks;
  one figure and one table (:mod:`baselines.compare`).

Needs the ``grpo`` extra (``pip install -e '.[grpo]'``: TRL and datasets).
"""
