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
GENERATION = ("generate", "continuous_batching", "evolm")
ENGINE_SAMPLING = {  # GRPOConfig fields evolm's sampler has no counterpart for: their no-op values
    "top_k": (0, None),
    "min_p": (None,),
    "repetition_penalty": (1.0,),
    "generation_kwargs": (None, {}),
}
OTHER_ROLLOUTS = ("use_vllm", "use_transformers_continuous_batching")  # TRL's own backends


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
        generation: where the rollouts are sampled: ``generate`` (``model.generate``, TRL's
            default), ``continuous_batching`` (transformers' continuous batching; needs
            transformers >= 5.8) or ``evolm`` (evolm's in-process engine, ``server=local``, from
            the current policy: the base weights plus the peft LoRA factors, read before every
            rollout as TRL's vLLM path syncs its weights; :mod:`baselines.grpo_rollouts`). With
            ``evolm`` one engine is loaded for the whole run and the evaluations reuse it; it
            samples at ``temperature`` and ``grpo.trl.top_p`` (``top_k``, ``min_p``,
            ``repetition_penalty`` and ``generation_kwargs`` are refused: it has none), to
            ``task.max_new_tokens``, an EOS or the task's stop strings (a row ends after the
            token that completes one, as the ES run's rows do, with no EOS after it, so
            ``grpo.trl.mask_truncated_completions`` is refused then; the other paths run on to
            an EOS and the reward cuts the text at the same place).
        engine_memory: with ``generation=evolm``, the engine's
            ``server.gpu_memory_utilization`` (it replaces the ES run's value, 0.9 by default,
            which would leave the training step nothing): the share of the GPU's memory the
            process may fill when the engine sizes its KV slots, both copies of the weights
            (the engine's and the policy's) and anything else already allocated included. The
            slots are sized for the rollouts' rows (``prompts_per_step x num_generations``) or
            for the evaluation's prompts, at most this share, and the rollouts' slots stay
            allocated between steps (evaluations release theirs), so about
            ``1 - engine_memory`` of the GPU stays free for the training step's activations.
            0.5 by default (TRL's colocated vLLM takes 0.3, but for itself alone: here the
            policy's weights count too). Ignored on CPUs.
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
    engine_memory: float = 0.5
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
        if not 0 < self.engine_memory <= 1:
            raise ConfigError(
                "grpo.engine_memory", f"must be in (0, 1], got {self.engine_memory}", "e.g. 0.5"
            )
        if self.generation == "evolm":
            self._check_engine_sampling()

    def _check_engine_sampling(self) -> None:
        """``generation=evolm`` samples with a temperature and a top-p only: a TRL setting the
        engine would ignore is refused (its key named), not silently dropped."""
        for key, no_ops in ENGINE_SAMPLING.items():
            if key in self.trl and self.trl[key] not in no_ops:
                raise ConfigError(
                    f"grpo.trl.{key}",
                    f"{self.trl[key]!r}: grpo.generation=evolm samples with a temperature and "
                    "top_p only",
                    f"drop grpo.trl.{key}, or use grpo.generation=generate",
                )
        for key in OTHER_ROLLOUTS:
            if self.trl.get(key):
                raise ConfigError(
                    f"grpo.trl.{key}",
                    "asks TRL for its own rollouts, and grpo.generation=evolm for the engine's",
                    f"drop grpo.trl.{key} (or use another grpo.generation)",
                )
        top_p = self.trl.get("top_p", 1.0)
        if not 0 < top_p <= 1:
            raise ConfigError("grpo.trl.top_p", f"must be in (0, 1], got {top_p}", "e.g. 0.95")

    def check_stops(self, stop: Sequence[str]) -> None:
        """With ``generation=evolm`` a row that ends at one of the task's stop strings has no
        EOS, which TRL's ``mask_truncated_completions`` would take for a truncated row and
        drop from the loss: refused."""
        if self.generation == "evolm" and stop and self.trl.get("mask_truncated_completions"):
            raise ConfigError(
                "grpo.trl.mask_truncated_completions",
                f"would drop every row that ends at a stop string {list(stop)} (no EOS follows "
                "it with grpo.generation=evolm) from the loss",
                "drop grpo.trl.mask_truncated_completions, or set task.stop=[]",
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
