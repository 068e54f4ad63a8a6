"""``python -m baselines.grpo``: GRPO with TRL's ``GRPOTrainer`` on an evolm task, as a user
would run it, held to the same budget and evaluated as the ES run is.

    python -m baselines.grpo model=qwen2.5-coder-0.5b-instruct task=countdown \\
        time_budget_s=1200 eval_every_s=120 output_dir=outputs/grpo/run1 grpo.learning_rate=1e-5

Every argument but ``grpo.<key>=...`` (:mod:`baselines.grpo_settings`) is an evolm override:
the model, task, LoRA layout (rank, alpha, targets), ``seed``, ``generations`` (the step cap),
``time_budget_s`` and ``eval_every_s`` mean what they mean for ``python -m evolm``, and
``server.*`` sets the engine that evaluates (with ``grpo.generation=evolm``, the one engine
that also samples the rollouts: :mod:`baselines.grpo_rollouts`). The run directory gets
``results.jsonl`` (evolm's keys: ``eval/*`` as the ES mean's, ``train/fitness_mean`` the mean
reward of the step's completions, ``train/tokens``, ``time/train_s``; TRL's logs as
``grpo/*``), ``peak_memory.json``, ``config.yaml``, the final ``adapter/`` (PEFT format)
and, at each evaluation, the first ``callbacks.samples.count`` eval prompts with the adapter's
completions and scores in ``samples/gen-<step>.jsonl`` (the ES run's ``samples/``, the same
count).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from baselines.evaluator import evaluate_adapter
from baselines.grpo_budget import BudgetCallback
from baselines.grpo_data import TaskReward, train_dataset, train_split
from baselines.grpo_settings import PREFIX, GRPOSettings, parse_settings, trl_config
from baselines.runconfig import SharedParts, build_shared, compose_run
from evolm.callbacks import Record
from evolm.callbacks.samples import SampleWriter
from evolm.engine.base import Engine
from evolm.errors import ConfigError
from evolm.loop import TrainClock
from evolm.sampling import Sampling

log = logging.getLogger("baselines.grpo")


def lora_config(parts: SharedParts) -> Any:
    """peft's LoRA with evolm's layout: the same rank, alpha, target modules and layers as the
    ES adapter (peft's own initialisation: A random, B = 0, so training starts at the base)."""
    from peft import LoraConfig

    layout = parts.layout
    every_layer = layout.target_layers == list(range(layout.num_layers))
    return LoraConfig(
        r=layout.rank,
        lora_alpha=layout.alpha,
        target_modules=list(layout.target_modules),
        layers_to_transform=None if every_layer else list(layout.target_layers),
        lora_dropout=0.0,
        bias="none",
        use_rslora=False,
        task_type="CAUSAL_LM",
    )


def run(overrides: Sequence[str], settings: GRPOSettings) -> Path:
    """Train with GRPO as ``overrides`` (evolm's) and ``settings`` say; returns the run dir."""
    cfg = compose_run(overrides)
    if "output_dir" not in {o.split("=", 1)[0] for o in overrides}:
        raise ConfigError("output_dir", "is not set", "e.g. output_dir=outputs/grpo/run1")
    run_dir = Path(cfg.output_dir)
    if settings.generation == "evolm" and "gpu_memory_utilization" in cfg.server:
        cfg.server.gpu_memory_utilization = settings.engine_memory  # beside the training step
    parts = build_shared(cfg)
    settings.check_stops(parts.task.sampling.stop)
    prompts = settings.prompts(getattr(parts.task, "samples_per_generation", 16))
    run_dir.mkdir(parents=True, exist_ok=True)
    plain = OmegaConf.to_container(cfg, resolve=True)
    settings_dict = OmegaConf.to_container(OmegaConf.structured(settings))
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml({**plain, "grpo": settings_dict}))
    engine = parts.make_engine() if settings.generation == "evolm" else None
    try:
        trainer = build_trainer(parts, settings, prompts, run_dir, engine)
        log.info(
            "GRPO: %d prompts x %d completions per step (rollouts: %s), lr %g, beta %g, %s; "
            "budget %s s of training, evals every %s s, at most %d steps",
            prompts,
            settings.num_generations,
            settings.generation,
            settings.learning_rate,
            settings.beta,
            "cuda" if torch.cuda.is_available() else "cpu",
            cfg.time_budget_s,
            cfg.eval_every_s,
            cfg.generations,
        )
        trainer.train()
        trainer.model.save_pretrained(str(run_dir / "adapter"))
    finally:
        if engine is not None:
            engine.close()
    log.info("run directory: %s", run_dir)
    return run_dir


def build_trainer(
    parts: SharedParts,
    settings: GRPOSettings,
    prompts: int,
    run_dir: Path,
    engine: Engine | None = None,
) -> Any:
    """TRL's ``GRPOTrainer`` on the task's training puzzles and reward, with the budget
    callback that times, evaluates, stops and records it. ``engine`` (``generation=evolm``):
    the engine that samples the rollouts (:class:`~baselines.grpo_rollouts.EngineGRPOTrainer`)
    and evaluates; None: each evaluation loads its own."""
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    cfg, task = parts.config, parts.task
    tokenizer = AutoTokenizer.from_pretrained(parts.model_path)
    examples = train_split(task)
    max_tokens = task.sampling.max_new_tokens
    args = trl_config(settings, run_dir / "trl", prompts, max_tokens, cfg.generations, cfg.seed)
    eos = tokenizer.eos_token_id
    reward = TaskReward(task, examples, [] if eos is None else [eos], max_tokens)
    writer = SampleWriter(count=OmegaConf.select(cfg, "callbacks.samples.count", default=0))

    def evaluate(tensors: Sequence[torch.Tensor], step: int) -> Record:
        record, samples = evaluate_adapter(parts, tensors, cfg.seed, engine)
        writer.write(run_dir, step, cfg.generations, samples)  # as the ES run's samples/
        return record

    budget = BudgetCallback(
        TrainClock(cfg.time_budget_s, cfg.eval_every_s),
        evaluate,
        parts.layout,
        reward,
        run_dir,
        cfg.generations,
    )
    kwargs: dict[str, Any] = {
        "model": parts.model_path,
        "reward_funcs": reward,
        "args": args,
        "train_dataset": train_dataset(tokenizer, examples),
        "processing_class": tokenizer,
        "peft_config": lora_config(parts),
        "callbacks": [budget],
    }
    if engine is None:
        trainer = GRPOTrainer(**kwargs)
    else:
        trainer = engine_trainer(parts, args, engine, kwargs)
    reward.eos_ids |= set(trainer.eos_token_ids)  # the model's generation config's too
    log.info("GRPO on the task's %d training prompts", len(examples))
    return trainer


def engine_trainer(parts: SharedParts, args: Any, engine: Engine, kwargs: dict[str, Any]) -> Any:
    """The trainer whose rollouts ``engine`` samples at TRL's settings (``args``: temperature,
    top-p, ``max_completion_length``) and the task's stop strings."""
    from baselines.grpo_rollouts import EngineGRPOTrainer, EngineRollouts

    sampling = Sampling(
        max_new_tokens=args.max_completion_length,
        temperature=args.temperature,
        top_p=args.top_p,
        stop=parts.task.sampling.stop,
    )
    rollouts = EngineRollouts(engine, parts.layout, sampling)
    return EngineGRPOTrainer(rollouts=rollouts, **kwargs)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
    )
    grpo = [a for a in argv if a.startswith(PREFIX)]
    try:
        run([a for a in argv if not a.startswith(PREFIX)], parse_settings(grpo))
    except ConfigError as e:
        log.error("bad configuration: %s", e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
