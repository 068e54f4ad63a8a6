"""``grpo.generation=evolm``: GRPO's rollouts sampled by evolm's in-process engine.

TRL's ``GRPOTrainer`` turns a generation batch into completions in one method,
``_generate_single_turn(prompt_ids, images, multimodal_fields, num_generations)`` (TRL 1.16),
which returns ``(completion_ids, logprobs)``: one list of token ids per row of ``prompt_ids``
(the rows already repeat each prompt ``num_generations`` times, consecutively), each up to and
including its EOS when it ended at one, and the sampler's per-token logprobs or None (its
``model.generate`` path returns None; nothing downstream needs them without vLLM's importance
sampling). :class:`EngineGRPOTrainer` overrides that method alone, so TRL's tokenization,
decoding, reward, advantages, loss and logging run unchanged, as with its vLLM path.

Each call samples every row in one engine call from the current policy: the base weights plus
the peft model's LoRA factors read at that moment (as TRL's vLLM path syncs its weights before
generating), at TRL's temperature and top-p, its ``max_completion_length``, the model's EOS ids
and the task's stop strings (a row ends after the token that completes one, as the ES run's rows
do; the reward cuts the text there on every path). The ids are the engine's own tokens, from
TRL's prompt ids: no text round trip. A call's rows draw from one ``torch.Generator`` seeded
with :func:`rollout_seed` ``(seed, call)``: the same config gives the same rollouts. Each
rollout's wall time is logged with TRL's metrics (``grpo/rollout_s`` in ``results.jsonl``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, cast

import torch
from trl import GRPOTrainer

from baselines.grpo_budget import adapter_tensors
from evolm.engine.backend import TokenRequest
from evolm.engine.base import Completion, Engine
from evolm.engine.local import LocalEngine
from evolm.es.noise import mix_seed
from evolm.lora import LoraLayout, LoraPopulation
from evolm.sampling import Sampling

log = logging.getLogger(__name__)
ROLLOUT_STREAM = 0x6772706F  # "grpo": rollout seeds apart from any other use of the run's seed


def rollout_seed(seed: int, call: int) -> int:
    """The sampling seed of the ``call``-th rollout (from 0) of a run seeded ``seed``."""
    return mix_seed(seed, ROLLOUT_STREAM, call)


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of token rows, left-padded to the longest (what the
    engine's text entry point builds from the same prompts)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(list(row), dtype=torch.long)
            mask[i, width - len(row) :] = 1
    return ids, mask


def trl_ids(completion: Completion, row: torch.Tensor, eos_ids: Sequence[int]) -> list[int]:
    """A completion's ids as TRL's generate path returns them: the generated tokens, then the
    EOS when the row ended at one (its id read from ``row``, the row's new tokens); a row that
    ended at a stop string or at the budget has no EOS."""
    assert completion.token_ids is not None, "the local engine returns token ids"
    ids = list(completion.token_ids)
    if completion.stopped or completion.truncated:
        return ids
    eos = int(row[len(ids)])
    if eos not in eos_ids:
        raise RuntimeError(f"a row ended at token {eos}, not at an EOS of {list(eos_ids)}")
    return [*ids, eos]


class EngineRollouts:
    """Completions of token rows by one persistent :class:`LocalEngine`, adapted by one LoRA.

    ``sampling``: temperature, top-p, token budget and stop strings of every rollout. The
    engine keeps its KV slots between calls (sized for the rollouts' rows at the first call
    that needs more); its ``close()`` (after each evaluation, and at the run's end) drops them
    and the adapter buffers, the model stays.
    """

    def __init__(self, engine: Engine, layout: LoraLayout, sampling: Sampling) -> None:
        if not isinstance(engine, LocalEngine):
            raise TypeError(f"rollouts need evolm's LocalEngine, not {type(engine).__name__}")
        self.engine: LocalEngine = engine
        self.layout, self.sampling = layout, sampling

    @property
    def eos_ids(self) -> list[int]:
        return list(self.engine.texts.eos_ids)

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], tensors: Sequence[torch.Tensor], seed: int
    ) -> list[list[int]]:
        """Each row's completion ids (:func:`trl_ids`), the rows adapted by the LoRA
        ``tensors`` (``layout``'s order) and sampled in one engine call from ``seed``."""
        texts, rows = self.engine.texts, len(prompt_ids)
        ids, mask = left_pad(prompt_ids, texts.pad_id)
        adapter = LoraPopulation.single(self.layout, [t.detach().float() for t in tensors])
        generator = torch.Generator(self.engine.device).manual_seed(seed)
        member = torch.zeros(rows, dtype=torch.long)  # every row: the one adapter
        request = TokenRequest(
            ids, mask, adapter, self.sampling, texts.eos_ids, generator, member=member
        )
        tokens = self.engine.backend.generate_ids(request).cpu()
        completions = cast(list[Completion], texts.completions(tokens, self.sampling.stop))
        return [trl_ids(c, tokens[i], texts.eos_ids) for i, c in enumerate(completions)]


class EngineGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` whose rollouts come from ``rollouts`` (see the module docstring);
    every other keyword is ``GRPOTrainer``'s."""

    def __init__(self, *args: Any, rollouts: EngineRollouts, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rollouts = rollouts
        self.rollout_calls = 0
        check_agreement(self, rollouts)

    def _generate_single_turn(
        self,
        prompt_ids: list[list[int]],
        images: Any,
        multimodal_fields: dict[str, Any],
        num_generations: int,
        has_tool_images: bool = False,
    ) -> tuple[list[list[int]], None]:
        """TRL 1.16's seam (see the module docstring): the rows' completion ids, no logprobs."""
        if images is not None or multimodal_fields or has_tool_images:
            raise ValueError("grpo.generation=evolm generates from text prompts only")
        start = time.perf_counter()
        tensors = adapter_tensors(self.model, self.rollouts.layout)  # the policy, now
        seed = rollout_seed(self.args.seed, self.rollout_calls)
        completion_ids = self.rollouts.generate(prompt_ids, tensors, seed)
        self.rollout_calls += 1
        seconds = time.perf_counter() - start
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["rollout_s"].append(seconds)
        log.debug(
            "rollout %d: %d rows, %d tokens in %.2fs",
            *(self.rollout_calls, len(prompt_ids), sum(map(len, completion_ids)), seconds),
        )
        return completion_ids, None


def check_agreement(trainer: GRPOTrainer, rollouts: EngineRollouts) -> None:
    """The engine and TRL read the same tokenizer and end rows at the same EOS ids (both load
    ``parts.model_path``): the ids the engine returns are what TRL decodes and scores."""
    engine_tokenizer = rollouts.engine.tokenizer
    trl_tokenizer = trainer.processing_class
    if engine_tokenizer is None or engine_tokenizer.get_vocab() != trl_tokenizer.get_vocab():
        raise RuntimeError("the engine's tokenizer is not TRL's: both must load parts.model_path")
    if set(trainer.eos_token_ids) != set(rollouts.eos_ids):
        raise RuntimeError(
            f"EOS ids differ: TRL ends completions at {sorted(trainer.eos_token_ids)}, the "
            f"engine at {sorted(rollouts.eos_ids)}"
        )
