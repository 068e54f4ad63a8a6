"""``time_budget_s`` and ``eval_every_s``: a run that stops on training time and evaluates at
training-time marks (what an equal-GPU-time comparison needs: ``baselines.compare``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from transformers import AutoConfig

from evolm import metrics as M
from evolm.app.checks import check_run_keys
from evolm.callbacks import GenerationRecord, RunContext
from evolm.callbacks.results import ResultsWriter
from evolm.engine.local import LocalEngine
from evolm.errors import ConfigError
from evolm.es import ES, ESState
from evolm.loop import ESLoop, TrainClock
from evolm.lora import LoraLayout, LoraSpec, es_scales, uniform_scales
from evolm.task.base import Example
from evolm.task.conciseness import Conciseness
from tests.helpers import compose_config, read_results


def test_clock_marks_and_budget() -> None:
    clock = TrainClock(budget_s=5.0, eval_every_s=2.0)
    passed = [clock.tick(0.9) for _ in range(6)]  # 0.9 1.8 2.7 3.6 4.5 5.4
    assert passed == [False, False, True, False, True, False]
    assert clock.out_of_time()
    resumed = TrainClock(eval_every_s=2.0, train_s=4.5)  # the next mark after the history's
    assert (resumed.next_mark, resumed.tick(1.0), resumed.timed) == (6.0, False, True)
    assert not TrainClock().timed and not TrainClock(train_s=1e9).out_of_time()


class FewPrompts(Conciseness):
    """Conciseness on two eval prompts: the marks are what is tested, not the eval."""

    def eval_examples(self) -> list[Example]:
        return super().eval_examples()[:2]


class FixedSeconds(ESLoop):
    """Every generation counts 1.0 s of training time, whatever the machine."""

    def step(self, state: ESState) -> tuple[ESState, GenerationRecord]:
        state, record = super().step(state)
        return state, replace(record, generation_s=1.0)


@pytest.mark.parametrize("eval_start", [True, False])
def test_loop_stops_on_the_budget_and_evaluates_at_the_marks(
    tmp_path: Path, tiny_model_dir: str, eval_start: bool
) -> None:
    """``eval_start=false`` (a second seed from a base another run measured) skips only the
    start's eval: generation 0's record is still written, without eval keys."""
    spec = LoraSpec()
    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir), spec)
    engine = LocalEngine(tiny_model_dir, layout, device="cpu")
    es = ES(population_size=2, sigma=0.01, alpha=1.0, update="natural")
    scales = uniform_scales(layout)
    state = es.init(layout.init_mean(spec, scales, 0), 0, es_scales(spec, scales))
    task = FewPrompts(max_new_tokens=4)
    loop = FixedSeconds(es, task, engine, layout, 100, 100, 0, [ResultsWriter()])
    loop = replace(loop, time_budget_s=4.5, eval_every_s=2.0, eval_start=eval_start)
    final, summary = loop.run(state, RunContext(tmp_path, 100, layout, tiny_model_dir))
    records = read_results(tmp_path)
    assert final.generation == 5  # 5 x 1.0 s reaches the 4.5 s budget; generations=100 is a cap
    assert [r[M.TRAIN_S] for r in records[1:]] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert records[0]["generation"] == 0
    evaluated = [r["generation"] for r in records if M.EVAL_REWARD in r]
    assert evaluated == ([0, 2, 4, 5] if eval_start else [2, 4, 5])
    assert summary[M.GENERATION] == 5 and M.EVAL_REWARD in summary


@pytest.mark.parametrize("key", ["time_budget_s", "eval_every_s"])
def test_time_keys_must_be_positive(key: str) -> None:
    check_run_keys(compose_config([f"{key}=60"]))
    with pytest.raises(ConfigError, match=f"{key}: must be > 0 seconds of training time"):
        check_run_keys(compose_config([f"{key}=0"]))
