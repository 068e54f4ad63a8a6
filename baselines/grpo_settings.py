"""GRPO's settings (``grpo.<key>=...`` on the command line) and the TRL ``GRPOConfig`` they make.

What the comparison fixes is not here: the model, puzzles, prompt, reward, stop strings, token
budget and LoRA layout come from evolm's config (:mod:`baselines.runconfig`); the time budget
and evaluation marks from ``time_budget_s`` / ``eval_every_s``; the step cap from
``generations``. These are the knobs a practitioner tunes: learning rate, group size, KL beta.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from evolm.errors import ConfigError
from evolm.preflight.compose_check import closest

PREFIX = "grpo."
GENERATION = ("generate", "continuous_batching")


@dataclass
class GRPOSettings:
    """GRPO's own settings (maximises reward, as evolm's tasks define it).

    Attributes:
        learning_rate: AdamW's (TRL's default, 1e-6, is for full fine-tuning; a LoRA needs
            more).
        num_generations: completions per prompt (the group whose rewards are normalized).
        prompts_per_step: prompts per optimizer step; ``None``: ``task.samples_per_generation``,
            the prompts an ES generation takes.
        micro_batch: completions per forward/backward pass (``per_device_train_batch_size``);
            must divide ``prompts_per_step * num_generations``.
        beta: the KL coefficient to the base (0: no reference model, TRL's default).
        temperature: sampling temperature of the training completions (evaluations are greedy).
        loss_type: TRL's (``dapo`` by default; ``grpo``, ``dr_grpo``, ``bnpo``...).
        scale_rewards: ``group`` (divide by the group's std), ``batch`` or ``none`` (Dr. GRPO).
        gradient_checkpointing: trade compute for activation memory (TRL's default: on).
        generation: ``generate`` (``model.generate``, TRL's default) or ``continuous_batching``
            (transformers' continuous batching; needs transformers >= 5.8).
        trl: any other ``GRPOConfig`` field, passed as is (``grpo.trl.epsilon_high=0.28``).
    """

    learning_rate: float = 1e-5
    num_generations: int = 8
    prompts_per_step: int | None = None
    micro_batch: int = 16
    beta: float = 0.0
    temperature: float = 1.0
    loss_type: str = "dapo"
    scale_rewards: str = "group"
    gradient_checkpointing: bool = True
    generation: str = "generate"
    trl: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.learning_rate > 0:
            raise ConfigError(
                "grpo.learning_rate", f"must be > 0, got {self.learning_rate}", "e.g. 1e-5"
            )
        if self.num_generations < 2:
            raise ConfigError(
                "grpo.num_generations",
                f"must be >= 2 (rewards are compared within a group), got {self.num_generations}",
                "e.g. 8",
            )
        if self.prompts_per_step is not None and self.prompts_per_step < 1:
            raise ConfigError(
                "grpo.prompts_per_step", f"must be >= 1, got {self.prompts_per_step}", "e.g. 16"
            )
        if self.micro_batch < 1:
            raise ConfigError(
                "grpo.micro_batch", f"must be >= 1, got {self.micro_batch}", "e.g. 16"
            )
        if self.beta < 0 or not self.temperature > 0:
            raise ConfigError(
                "grpo.beta", "beta must be >= 0 and temperature > 0", "e.g. beta=0.04"
            )
        if self.generation not in GENERATION:
            raise ConfigError(
                "grpo.generation", f"unknown: {self.generation!r}", f"one of {list(GENERATION)}"
            )

    def prompts(self, default_prompts: int) -> int:
        """Prompts per optimizer step; their completions must split into micro-batches."""
        prompts = self.prompts_per_step or default_prompts
        rows = prompts * self.num_generations
        if rows % self.micro_batch:
            raise ConfigError(
                "grpo.micro_batch",
                f"{self.micro_batch} does not divide the {rows} completions of a step "
                f"({prompts} prompts x {self.num_generations})",
                f"use a divisor of {rows}, e.g. grpo.micro_batch={self.num_generations}",
            )
        return prompts


def parse_settings(overrides: Sequence[str]) -> GRPOSettings:
    """The settings from ``grpo.<key>=<value>`` overrides (typed and checked: an unknown key is
    a ConfigError naming the closest ones)."""
    dotlist = [o.removeprefix(PREFIX) for o in overrides]
    try:
        merged = OmegaConf.merge(
            OmegaConf.structured(GRPOSettings), OmegaConf.from_dotlist(dotlist)
        )
        settings = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        name = str(getattr(e, "full_key", "") or "")
        known = list(GRPOSettings.__dataclass_fields__)
        near = closest(name, known)
        hint = (
            "give it a value of its type (baselines/grpo_settings.py)"
            if name.split(".")[0] in known
            else f"did you mean {', '.join(PREFIX + n for n in near)}?"
            if near
            else f"one of {', '.join(PREFIX + n for n in known)}"
        )
        key = PREFIX + name
        raise ConfigError(key, str(e).splitlines()[0], hint) from None
    assert isinstance(settings, GRPOSettings)
    return settings


def trl_config(
    settings: GRPOSettings,
    output_dir: Path,
    prompts: int,
    max_new_tokens: int,
    max_steps: int,
    seed: int,
) -> Any:
    """TRL's ``GRPOConfig``: one optimizer step per generation batch of ``prompts`` groups,
    constant learning rate (the budget, not a schedule, ends the run), nothing saved or reported
    by TRL itself (the budget callback writes the results)."""
    from trl import GRPOConfig

    rows = prompts * settings.num_generations
    cuda = torch.cuda.is_available()
    args: dict[str, Any] = {
        "output_dir": str(output_dir),
        "learning_rate": settings.learning_rate,
        "lr_scheduler_type": "constant",
        "num_generations": settings.num_generations,
        "per_device_train_batch_size": settings.micro_batch,
        "gradient_accumulation_steps": rows // settings.micro_batch,
        "max_completion_length": max_new_tokens,
        "temperature": settings.temperature,
        "beta": settings.beta,
        "loss_type": settings.loss_type,
        "scale_rewards": settings.scale_rewards,
        "gradient_checkpointing": settings.gradient_checkpointing,
        "use_transformers_continuous_batching": settings.generation == "continuous_batching",
        "max_steps": max_steps,
        "logging_steps": 1,
        "save_strategy": "no",
        "eval_strategy": "no",
        "report_to": "none",
        "seed": seed,
        "bf16": cuda,
        "use_cpu": not cuda,
        "remove_unused_columns": False,
        "disable_tqdm": True,
        "model_init_kwargs": {"dtype": "bfloat16" if cuda else "float32"},
        **settings.trl,
    }
    return GRPOConfig(**args)
