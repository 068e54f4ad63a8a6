"""The TRL callback that holds GRPO to the comparison's rules and writes its ``results.jsonl``.

Training time is counted as evolm's loop counts it (:class:`evolm.loop.TrainClock`): the wall
time of the optimizer steps (generation, scoring, backward, update, TRL's bookkeeping), not the
evaluations nor the start-up. The adapter is evaluated at the start, at the first step that ends
at or after each ``eval_every_s`` mark, and at the end; training stops after the first step that
brings the training time to ``time_budget_s`` (or at the step cap). One record per step, in
evolm's names, plus TRL's own logs under ``grpo/``.

A step in which every group's completions scored alike (TRL's ``frac_reward_zero_std`` 1) has
all its advantages 0 and moves nothing: the run says so at each such step, and at its end,
``THIS GRPO RUN IS NOT LEARNING``, when no step had a group with a reward spread (as evolm's
health monitor tells an ES run whose members all tie).
"""

from __future__ import annotations

import logging
import numbers
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from baselines.grpo_data import TaskReward
from baselines.memory import peak_gb, write_peak
from evolm import metrics as M
from evolm.callbacks import Record
from evolm.callbacks.results import json_line
from evolm.loop import TrainClock
from evolm.lora import LoraLayout

log = logging.getLogger(__name__)
RESULTS = "results.jsonl"
TIED = "grpo/frac_reward_zero_std"  # TRL's share of groups whose rewards all tie
TIED_ADVICE = (
    "raise grpo.temperature or grpo.num_generations, or check that the model earns any reward "
    "on this task (e.g. its answer format; task.max_new_tokens may cut answers off)"
)


def adapter_tensors(model: Any, layout: LoraLayout) -> list[torch.Tensor]:
    """The peft model's LoRA factors in ``layout``'s order (PEFT key names are evolm's)."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(model)
    missing = [k for k in layout.peft_keys() if k not in state]
    if missing:
        raise KeyError(f"the GRPO model has no LoRA factor {missing[0]} (of {len(missing)})")
    return [state[k].detach().float().cpu() for k in layout.peft_keys()]


class BudgetCallback(TrainerCallback):
    """Times, evaluates, stops and records a GRPO run (see the module's docstring)."""

    def __init__(
        self,
        clock: TrainClock,
        evaluate: Callable[[Sequence[torch.Tensor], int], Record],
        layout: LoraLayout,
        reward: TaskReward,
        run_dir: Path,
        max_steps: int,
    ) -> None:
        self.clock, self.evaluate, self.layout, self.reward = clock, evaluate, layout, reward
        self.run_dir, self.max_steps = run_dir, max_steps
        self.results = run_dir / RESULTS
        self.pending: Record | None = None
        self.steps = self.tied_steps = 0
        self.peak = 0.0
        self.last = time.perf_counter()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.results.write_text("", encoding="utf-8")
        self._write(
            {M.GENERATION: 0, **self.evaluate(adapter_tensors(kwargs["model"], self.layout), 0)}
        )
        self._fresh_peak()
        self.last = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        seconds = time.perf_counter() - self.last
        marked = self.clock.tick(seconds)
        self.peak = max(self.peak, peak_gb()[0])
        step = state.global_step
        record: Record = {M.GENERATION: step, **self.reward.drain()}
        record |= {M.GENERATION_S: seconds, M.TRAIN_S: self.clock.train_s}
        last = self.clock.out_of_time() or step >= self.max_steps
        if marked or last:
            record |= self.evaluate(adapter_tensors(kwargs["model"], self.layout), step)
            self._fresh_peak()
        if self.clock.out_of_time():
            control.should_training_stop = True
            log.info("time budget reached: %.1fs of training in %d steps", self.clock.train_s, step)
        write_peak(self.run_dir, self.peak, peak_gb()[1], "GRPO training steps, evals excluded")
        self.pending = record
        self.last = time.perf_counter()

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if self.pending is None:
            return
        trl = {f"grpo/{k}": float(v) for k, v in (logs or {}).items() if _number(v)}
        self._count_ties(self.pending[M.GENERATION], trl.get(TIED))
        self._write({**self.pending, **trl})
        self.pending = None

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.pending is not None:
            self._write(self.pending)
            self.pending = None
        if self.steps and self.tied_steps == self.steps:
            log.warning(
                "THIS GRPO RUN IS NOT LEARNING: in all %d steps every group's completions scored "
                "alike, so no step had an advantage to follow and the adapter never moved; %s",
                self.steps,
                TIED_ADVICE,
            )

    def _count_ties(self, step: int, tied: float | None) -> None:
        """Count a step TRL logged, and say so when every group in it tied."""
        if tied is None:
            return
        self.steps += 1
        if tied < 1.0:
            return
        self.tied_steps += 1
        log.warning(
            "GRPO step %d learned nothing: every group's completions scored alike (%s 1.0), so "
            "its advantages are all 0 (%d of %d steps so far)%s",
            *(step, TIED, self.tied_steps, self.steps),
            f"; {TIED_ADVICE}" if self.tied_steps == 1 else "",
        )

    def _write(self, record: Record) -> None:
        with open(self.results, "a", encoding="utf-8") as f:
            f.write(json_line(record))

    def _fresh_peak(self) -> None:
        """Forget the evaluation's memory (its engine, or with ``grpo.generation=evolm`` the
        engine's KV slots, is released): the peak is training's (rollouts included)."""
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()


def _number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
