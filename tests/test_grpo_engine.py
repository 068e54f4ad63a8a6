"""``grpo.generation=evolm``: GRPO's rollouts from evolm's engine, on the countdown tiny model
(CPU): two-step runs through ``python -m baselines.grpo``'s own entry point, and the trainer's
rollout seam checked against the engine itself.

What could break: TRL calling another seam (the engine would never be asked), the adapter not
synced (every rollout from the start's LoRA), completion ids that are not the engine's (EOS or
stop handling off by a token, a tokenizer mismatch), a second engine loaded for evaluations,
unseeded sampling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from baselines import grpo
from baselines.grpo_budget import adapter_tensors
from baselines.grpo_data import train_dataset, train_split
from baselines.grpo_rollouts import EngineGRPOTrainer, EngineRollouts, rollout_seed
from baselines.grpo_settings import parse_settings
from baselines.report import Run
from baselines.runconfig import build_shared, compose_run
from evolm import metrics as M
from evolm.engine.base import TextRequest
from evolm.engine.local import LocalEngine
from evolm.errors import ConfigError
from evolm.lora import LoraPopulation
from evolm.sampling import cut_at_stop
from tests.helpers import COUNTDOWN_MODEL, read_results

STOP = "</answer>"
SEED = 1  # seed 0's first 8 rollouts all scored the same on session 32's 800-step build: no update
EVOLM = [  # evolm overrides: two updates of 2 prompts x 4 completions, an eval after each
    "task=countdown",
    *COUNTDOWN_MODEL,
    f"seed={SEED}",
    "task.max_new_tokens=48",
    f"task.stop=['{STOP}']",
    "task.eval_samples=12",
    "task.samples_per_generation=2",
    "generations=2",
    "eval_every_s=0.000001",
    "logger=none",
]
GRPO = [
    "grpo.generation=evolm",
    "grpo.num_generations=4",
    "grpo.micro_batch=8",
    "grpo.learning_rate=0.01",
]


@dataclass
class Rollout:
    """One call of the engine's rollouts: what it was given and what it returned."""

    tensors: list[torch.Tensor]
    seed: int
    completion_ids: list[list[int]]


@dataclass
class Recorded:
    run_dir: Path
    rollouts: list[Rollout] = field(default_factory=list)
    loads: int = 0
    eos_ids: list[int] = field(default_factory=list)


def recorded_run(run_dir: Path, generation: str = "evolm") -> Recorded:
    """``python -m baselines.grpo`` in this process, every rollout of the engine recorded."""
    out = Recorded(run_dir)
    real = EngineRollouts.generate

    def generate(
        self: EngineRollouts,
        prompt_ids: Sequence[Sequence[int]],
        tensors: Sequence[torch.Tensor],
        seed: int,
    ) -> list[list[int]]:
        ids = real(self, prompt_ids, tensors, seed)
        out.rollouts.append(Rollout([t.clone() for t in tensors], seed, ids))
        out.eos_ids = self.eos_ids
        return ids

    loads = LocalEngine.loads
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EngineRollouts, "generate", generate)
        args = [*EVOLM, *GRPO, f"grpo.generation={generation}", f"output_dir={run_dir}"]
        assert grpo.main(args) == 0
    out.loads = LocalEngine.loads - loads
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, countdown_model_dir: str) -> list[Recorded]:
    """The same config run twice, then with ``grpo.generation=generate`` (TRL's default)."""
    evolm = [recorded_run(tmp_path_factory.mktemp(f"grpo-evolm-{i}")) for i in range(2)]
    return [*evolm, recorded_run(tmp_path_factory.mktemp("grpo-generate"), "generate")]


def b_factors(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t for i, t in enumerate(tensors) if i % 2 == 1]  # layout order: A, B per target


def test_a_run_samples_its_rollouts_from_the_engine_with_the_current_adapter(
    runs: list[Recorded],
) -> None:
    run = runs[0]
    records = read_results(run.run_dir)
    assert [r[M.GENERATION] for r in records] == [0, 1, 2]
    assert run.loads == 1  # one engine: the rollouts' and the three evaluations'
    assert len(run.rollouts) == 2 and all(len(r.completion_ids) == 8 for r in run.rollouts)
    first, second = run.rollouts
    assert all(not b.any() for b in b_factors(first.tensors))  # peft's start: B = 0
    assert any(b.abs().max() > 0 for b in b_factors(second.tensors))  # after one update
    final = grpo_adapter(run.run_dir, len(second.tensors))
    assert any(not torch.equal(a, b) for a, b in zip(second.tensors, final, strict=True))
    for record, rollout in zip(records[1:], run.rollouts, strict=True):
        assert record["grpo/reward"] == pytest.approx(record[M.FITNESS_MEAN], abs=1e-6)
        assert record[M.EVAL_REWARD] is not None and record[M.TRAIN_S] > 0
        ended = [bool(ids) and ids[-1] in run.eos_ids for ids in rollout.completion_ids]
        generated = sum(len(ids) - e for ids, e in zip(rollout.completion_ids, ended, strict=True))
        assert record["train/tokens"] == generated > 0  # the engine's tokens, EOS not counted
    points = Run.load("grpo", run.run_dir).points()  # what the comparison's report reads
    assert [p.generation for p in points] == [0, 1, 2] and points[-1].tokens > 0


def test_a_run_writes_the_keys_of_trls_own_rollouts(runs: list[Recorded]) -> None:
    """The same records as ``generation=generate`` writes (the same eval at the start: one
    model, one evaluator), with the engine's time per rollout beside TRL's logs."""
    evolm, generate = read_results(runs[0].run_dir), read_results(runs[2].run_dir)
    assert not runs[2].rollouts and runs[2].loads == 3  # an engine per evaluation there
    assert evolm[0] == {**generate[0], M.EVAL_S: evolm[0][M.EVAL_S]}
    for a, b in zip(evolm[1:], generate[1:], strict=True):
        assert keys(a) == keys(b) | {"grpo/rollout_s"} and a["grpo/rollout_s"] > 0


def keys(record: dict[str, Any]) -> set[str]:
    """A record's keys but those a summary writes only where the answers define them (the
    share of right answers that are templates: some right answer; the answers' precision: some
    answer), which two runs' different adapters need not share."""
    given = (M.TEMPLATE_SHARE, M.ANSWER_FORM_TOP_SHARE, M.ANSWER_PRECISION)
    return {k for k in record if k.rsplit("/", 1)[-1] not in given}


def grpo_adapter(run_dir: Path, count: int) -> list[torch.Tensor]:
    """The run's final adapter in layout order (the saved PEFT file's keys are the layout's)."""
    from safetensors.torch import load_file

    weights = load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))
    assert len(weights) == count
    return [w.float() for w in weights.values()]


def test_the_same_config_gives_the_same_run(runs: list[Recorded]) -> None:
    a, b = (read_results(r.run_dir) for r in runs[:2])
    keys = (M.FITNESS_MEAN, "grpo/reward", "train/tokens", M.EVAL_REWARD, "grpo/loss")
    assert [[r.get(k) for k in keys] for r in a] == [[r.get(k) for k in keys] for r in b]
    assert [r.completion_ids for r in runs[0].rollouts] == [
        r.completion_ids for r in runs[1].rollouts
    ]
    seeds = [r.seed for r in runs[0].rollouts]
    assert seeds == [rollout_seed(SEED, 0), rollout_seed(SEED, 1)] and seeds[0] != seeds[1]
    config = (runs[0].run_dir / "config.yaml").read_text()
    assert "gpu_memory_utilization: 0.5" in config  # grpo.engine_memory, the engine's share


@pytest.fixture(scope="module", params=["fast", "HF"])
def contract(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    countdown_model_dir: str,
) -> Any:
    """A trainer of ``generation=evolm`` (not trained), its LoRA B factors set at random so
    the adapter changes the answers, and its engine (either path of the local engine)."""
    path = [] if request.param == "fast" else ["server.fast=false"]
    cfg = compose_run([*EVOLM, *path, f"output_dir={tmp_path_factory.mktemp('contract')}"])
    settings = parse_settings(GRPO)
    parts = build_shared(cfg)
    engine = parts.make_engine()
    assert engine.backend.name == request.param
    trainer = grpo.build_trainer(parts, settings, 2, Path(cfg.output_dir), engine)
    assert isinstance(trainer, EngineGRPOTrainer)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    return trainer, parts, engine


def test_the_completion_ids_are_the_engines_for_the_prompt_adapter_and_seed(
    contract: Any,
) -> None:
    """TRL's ``_generate`` (its tokenization, the seam, its decoding) against the engine's own
    text entry point with the same adapter and seed: each row's ids are the engine's tokens,
    plus the EOS where the row ended at one; a row that ended at the stop string ends with the
    token that completes it."""
    trainer, parts, engine = contract
    examples = train_split(parts.task)
    prompts = list(train_dataset(trainer.processing_class, examples[:6])["prompt"])
    rows = [p for p in prompts for _ in range(4)]  # TRL's groups: each prompt 4 times in a row
    prompt_ids, completion_ids, _, texts, logprobs, extra, _, _ = trainer._generate(rows)
    assert logprobs is None and extra == {}
    tensors = adapter_tensors(trainer.model, parts.layout)
    adapter = LoraPopulation.single(parts.layout, tensors)
    sampling = trainer.rollouts.sampling
    assert (sampling.temperature, sampling.max_new_tokens, sampling.stop) == (1.0, 48, (STOP,))
    seed, pairs = rollout_seed(SEED, 0), [(0, i) for i in range(len(rows))]  # the first rollout
    want = engine.generate_rows(TextRequest(rows, adapter, pairs, sampling, seed))
    eos = set(trainer.eos_token_ids)
    kinds = set()
    for i, (ids, c) in enumerate(zip(completion_ids, want, strict=True)):
        assert prompt_ids[i] == engine.tokenizer(rows[i])["input_ids"]  # one tokenizer
        if c.stopped:
            kinds.add("stop")
            assert ids == list(c.token_ids) and ids[-1] not in eos
            decode = trainer.processing_class.decode  # the last token completes the stop
            assert STOP in decode(ids) and STOP not in decode(ids[:-1])  # (or runs past it)
        elif c.truncated:
            kinds.add("budget")
            assert ids == list(c.token_ids) and len(ids) == 48
        else:
            kinds.add("eos")
            assert ids[:-1] == list(c.token_ids) and ids[-1] in eos
        assert cut_at_stop(texts[i], (STOP,))[0] == str(c)  # what the reward scores
    assert {"stop", "eos"} <= kinds, kinds  # both endings exercised
    base = engine.generate_rows(TextRequest(rows, None, pairs, sampling, seed))
    assert [c.token_ids for c in base] != [c.token_ids for c in want]  # the adapter matters


def test_the_engine_refuses_trl_sampling_it_cannot_honour() -> None:
    with pytest.raises(ConfigError, match=r"grpo\.trl\.top_k"):
        parse_settings(["grpo.generation=evolm", "grpo.trl.top_k=5"])
    with pytest.raises(ConfigError, match=r"grpo\.trl\.repetition_penalty"):
        parse_settings(["grpo.generation=evolm", "grpo.trl.repetition_penalty=1.1"])
    with pytest.raises(ConfigError, match=r"grpo\.trl\.use_vllm"):
        parse_settings(["grpo.generation=evolm", "grpo.trl.use_vllm=true"])
    with pytest.raises(ConfigError, match=r"grpo\.engine_memory"):
        parse_settings(["grpo.generation=evolm", "grpo.engine_memory=0"])
    with pytest.raises(ConfigError, match="evolm"):
        parse_settings(["grpo.generation=vllm"])
    masked = parse_settings(["grpo.generation=evolm", "grpo.trl.mask_truncated_completions=true"])
    with pytest.raises(ConfigError, match=r"grpo\.trl\.mask_truncated_completions"):
        masked.check_stops((STOP,))  # rows that end at the stop string have no EOS
    masked.check_stops(())
    assert parse_settings(["grpo.trl.top_k=5"]).trl == {"top_k": 5}  # other paths honour it
    assert parse_settings(["grpo.generation=evolm", "grpo.trl.top_p=0.9"]).generation == "evolm"
