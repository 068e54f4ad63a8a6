"""Metric names, spelled once: what a run's records hold.

A record is one line of ``results.jsonl`` and one MLflow step: ``generation`` plus namespaced
numbers. ``train/`` describes the generation's population, ``eval/`` the mean on held-out
prompts, ``es/`` the update, ``time/`` seconds, ``data/`` the task's data (generation 0 only).
A task's score ``k`` (any key its ``score`` returns besides ``reward``) appears as
``train/k_mean`` and ``eval/k_mean``; the population's mean reward is ``train/fitness_mean`` (a
member's fitness is its mean reward).
"""

from __future__ import annotations

GENERATION = "generation"

FITNESS_MEAN = "train/fitness_mean"
FITNESS_STD = "train/fitness_std"
FITNESS_MIN = "train/fitness_min"
FITNESS_MAX = "train/fitness_max"
FITNESS_P20 = "train/fitness_p20"
FITNESS_P80 = "train/fitness_p80"
FITNESS_NONFINITE = "train/fitness_nonfinite"

UPDATE_NORM = "es/update_norm"
MEAN_NORM = "es/mean_norm"

EVAL_REWARD = "eval/reward_mean"

GENERATION_S = "time/generation_s"
GENERATE_S = "time/generate_s"
SCORE_S = "time/score_s"
ES_S = "time/es_s"
EVAL_S = "time/eval_s"
COMM_S = "time/comm_s"  # distributed runs: the generation's all-gather and mean check


def train_score(key: str) -> str:
    """The population's mean of a task score, e.g. ``train/accuracy_mean``."""
    return f"train/{key}_mean"


def eval_score(key: str) -> str:
    """The mean's mean of a task score on the eval split, e.g. ``eval/reward_mean``."""
    return f"eval/{key}_mean"


def task_stat(key: str) -> str:
    """A number the task's ``after_generation`` hook returned, e.g. ``train/lambda``."""
    return f"train/{key}"


def data_stat(key: str) -> str:
    """A number about the task's data (its ``data_stats`` hook), in generation 0's record, e.g.
    ``data/train_test_overlap``."""
    return f"data/{key}"


def engine_time(key: str) -> str:
    """A phase of the engine's last generation, e.g. ``time/engine_decode_s``."""
    return f"time/engine_{key}"


def is_eval(key: str) -> bool:
    """Keys an evaluation of the mean adds to a record."""
    return key.startswith("eval/") or key == EVAL_S
