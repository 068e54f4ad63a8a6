"""Members that sample, a mean evaluated greedily: ``task.eval_temperature`` (countdown) is the
decoding of every evaluation of the mean, ``task.temperature`` the members'."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from evolm.engine.local import LocalEngine
from evolm.errors import ConfigError
from evolm.evaluate import evaluate
from evolm.loop import eval_metrics
from evolm.lora import LoraLayout, LoraPopulation, LoraSpec
from evolm.task.base import eval_sampling
from evolm.task.countdown import Countdown

SMALL = {
    "train_size": 4,
    "generate_count": 12,
    "samples_per_generation": 4,
    "eval_samples": 6,
    "max_new_tokens": 24,
}


def test_eval_temperature_sets_the_means_decoding_only() -> None:
    task = Countdown(**SMALL, temperature=0.7, eval_temperature=0.0)
    assert task.sampling.temperature == 0.7 and eval_sampling(task).temperature == 0.0
    assert eval_sampling(task).max_new_tokens == 24  # the rest is the members' decoding
    same = Countdown(**SMALL, temperature=0.7)
    assert eval_sampling(same) is same.sampling
    with pytest.raises(ConfigError, match=r"task\.eval_temperature"):
        Countdown(**SMALL, eval_temperature=-1.0)


def test_members_sample_while_the_mean_is_evaluated_greedily(tiny_model_dir: str) -> None:
    config = AutoConfig.from_pretrained(tiny_model_dir)
    layout = LoraLayout.from_hf_config(config, LoraSpec(rank=2))
    engine = LocalEngine(tiny_model_dir, layout, device="cpu")
    mean = LoraPopulation.single(layout, [torch.zeros(s) for s in layout.shapes()])
    greedy = Countdown(**SMALL)
    sampled = Countdown(**SMALL, temperature=1.0)
    mixed = Countdown(**SMALL, temperature=1.0, eval_temperature=0.0)

    def mean_answers(task: Countdown) -> list[str]:
        return eval_metrics(engine, task, mean, seed=0, kl=False)[1].completions[0]

    assert mean_answers(mixed) == mean_answers(greedy)
    assert mean_answers(sampled) != mean_answers(greedy)
    rows = mixed.train_examples(1)  # the members' rows still sample
    assert (
        evaluate(engine, mixed, rows, mean, seed=0).completions
        == evaluate(engine, sampled, rows, mean, seed=0).completions
    )
