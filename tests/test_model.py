"""Tests for evolm.model: specs, the offline tiny-model builder and the loader (CPU, fast)."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from tokenizers import Tokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from evolm.app.build import resolve_model
from evolm.errors import ConfigError
from evolm.model import HubModel, ModelSpec, TinyModel, load_causal_lm
from evolm.model import cache as model_cache
from evolm.model.cache import CACHE_ENV, build_atomically, is_built
from evolm.model.gguf.weights import MODELS, locate
from evolm.model.tiny import pinned
from evolm.model.tiny.build import build_tiny_model
from evolm.model.tiny.pinned import build_pinned
from evolm.task.countdown import warmup as countdown_warmup
from evolm.task.countdown.reward import paper_prompt
from evolm.task.countdown.warmup import CountdownWarmup
from tests.helpers import COUNTDOWN_DEMO, COUNTDOWN_TINY, REPO, NoLocks, compose_config

CONF_MODEL = Path(__file__).resolve().parents[1] / "conf" / "model"

TEXTS = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "Solve: 3 + 5 =",
    "What is the capital of France?",
    "1234567890 and 3.14159, -42, 1e-9",
    "Using the numbers [19, 36, 55, 7], create an equation that equals 65.",
    "<think> 55 + 19 = 74; 74 - 9 = 65 </think>\n<answer> 55 + 19 - (36 - 27) </answer>",
    "line one\nline two\r\nline three\n\n\nend",
    "   leading spaces, trailing spaces   ",
    "tabs\tand\tmore\t\ttabs",
    "it's, we'll, they've, I'M, you'D",
    "Café naïve résumé Zürich São Paulo",
    "Ελλάδα Москва 東京 北京 서울",
    "emoji 🙂🚀 and symbols € £ ¥ © ™ ± × ÷",
    "e\u0301 composed by NFC",
    "CamelCaseIdentifier snake_case_name kebab-case",
    "def f(x):\n    return x ** 2  # square",
    '{"key": "value", "list": [1, 2, 3]}',
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.",
    "",
]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tiny_dir(tiny_model_dir: str) -> Path:
    return Path(tiny_model_dir)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="module")
def trained(tiny_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))


QUICK = {"warmup_steps": 3}  # builds that test mechanics, not the warmed-up model


def test_build_is_byte_for_byte_deterministic(tmp_path: Path) -> None:
    spec = TinyModel(**QUICK)
    a, b = build_tiny_model(tmp_path / "a", spec), build_tiny_model(tmp_path / "b", spec)
    files = sorted(p.name for p in a.iterdir())
    assert {"model.safetensors", "tokenizer.json", "config.json", "generation_config.json"} <= set(
        files
    )
    assert files == sorted(p.name for p in b.iterdir())
    for name in files:
        assert sha256(a / name) == sha256(b / name), name


def test_the_warm_up_takes_no_square_root_from_mkls_vector_math(tmp_path: Path) -> None:
    """``torch.sqrt`` goes to MKL's vector math, which rounds ~1.4% of float64 square roots one
    ulp off, differently on Intel and AMD CPUs (``python -m benchmarks.cpu_vendor``); the
    unfused AdamW took one per weight per step, and the two vendors built different models.
    The warm-up's optimizer step is the fused one (ATen's square root), and nothing in a step
    (a question/answer one and countdown ones) calls ``aten.sqrt``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from evolm.task.countdown.warmup import CountdownWarmup

    called: set[str] = set()

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            called.add(str(func))
            return func(*args, **(kwargs or {}))

    spec = TinyModel(warmup_steps=4, countdown_share=0.5, max_position_embeddings=2048)
    with Ops():
        build_tiny_model(tmp_path, spec, CountdownWarmup())
    assert "aten._fused_adamw_.default" in called
    assert not {op for op in called if op.startswith("aten.sqrt")}, sorted(called)


def test_build_leaves_global_rng_untouched(tmp_path: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path, TinyModel(seed=7, **QUICK))
    assert torch.equal(torch.rand(3), expected)


def test_seed_changes_weights_not_tokenizer(tmp_path: Path) -> None:
    a = build_tiny_model(tmp_path / "a", TinyModel(seed=0, **QUICK))
    b = build_tiny_model(tmp_path / "b", TinyModel(seed=1, **QUICK))
    assert sha256(a / "model.safetensors") != sha256(b / "model.safetensors")
    assert sha256(a / "tokenizer.json") == sha256(b / "tokenizer.json")


def test_autotokenizer_is_qwen2_with_full_vocab(
    tokenizer: PreTrainedTokenizerBase, tiny_dir: Path
) -> None:
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    assert len(tokenizer) == TinyModel().vocab_size
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.bos_token is None


@pytest.mark.parametrize("text", TEXTS)
def test_autotokenizer_ids_equal_trained_ids(
    tokenizer: PreTrainedTokenizerBase, trained: Tokenizer, text: str
) -> None:
    ids = tokenizer(text)["input_ids"]
    assert ids == trained.encode(text).ids
    assert tokenizer.decode(ids) == trained.decode(ids)


@pytest.mark.parametrize("token", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
def test_special_tokens_encode_to_single_ids(
    tokenizer: PreTrainedTokenizerBase, trained: Tokenizer, token: str
) -> None:
    ids = tokenizer(f"a{token}b")["input_ids"]
    assert tokenizer.convert_tokens_to_ids(token) in ids
    assert len(tokenizer(token)["input_ids"]) == 1
    assert ids == trained.encode(f"a{token}b").ids


def test_chat_template_renders_chatml(tokenizer: PreTrainedTokenizerBase) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3 + 3?"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert "<|im_start|>assistant\n4<|im_end|>\n" in text
    assert text.endswith("<|im_start|>user\nAnd 3 + 3?<|im_end|>\n<|im_start|>assistant\n")
    no_prompt = tokenizer.apply_chat_template(messages[1:2], tokenize=False)
    assert no_prompt.startswith("<|im_start|>system\n")  # a default system turn, like Qwen2.5
    assert no_prompt.endswith("<|im_end|>\n")


def test_generation_config_stops_on_both_eos(
    tiny_dir: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    model, _ = load_causal_lm(str(tiny_dir), device="cpu", dtype=torch.float32)
    gen = model.generation_config
    ids = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert list(gen.eos_token_id) == ids
    assert gen.pad_token_id == tokenizer.pad_token_id
    assert model.config.tie_word_embeddings
    assert model.config.model_type == "qwen2"


@pytest.fixture
def one_thread() -> Iterator[None]:
    """A tiny model on 2 shared cores runs faster (and steadier) on one intra-op thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_left_padded_batch_generates_like_single_prompts(tiny_dir: Path) -> None:
    model, tok = load_causal_lm(str(tiny_dir), device="cpu", dtype=torch.float32)
    assert tok.padding_side == "left"
    assert not model.training
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": c}], tokenize=False, add_generation_prompt=True
        )
        for c in ["Hi", "What is the capital of France? Answer in one word, please."]
    ]
    kwargs = {"max_new_tokens": 16, "do_sample": False, "min_new_tokens": 16}
    batch = tok(prompts, return_tensors="pt", padding=True)
    assert (batch["attention_mask"][0] == 0).any()  # the short prompt really is padded
    with torch.no_grad():
        batched = model.generate(**batch, **kwargs)[:, batch["input_ids"].shape[1] :]
        for row, prompt in enumerate(prompts):
            alone = tok(prompt, return_tensors="pt")
            single = model.generate(**alone, **kwargs)[0, alone["input_ids"].shape[1] :]
            assert torch.equal(batched[row], single), row


def test_head_dim_below_32_raises() -> None:
    with pytest.raises(ConfigError, match="hidden_size") as err:
        TinyModel(hidden_size=64, num_heads=4)
    assert err.value.key == "num_heads"


def test_kv_heads_must_divide_heads() -> None:
    with pytest.raises(ConfigError) as err:
        TinyModel(hidden_size=192, num_heads=3, num_kv_heads=2)
    assert err.value.key == "num_kv_heads"


def test_hub_model_missing_local_path_raises(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        HubModel(str(tmp_path / "missing")).resolve()
    assert err.value.key == "name_or_path"
    with pytest.raises(ConfigError):
        HubModel("./no/such/model").resolve()


def test_hub_model_resolves_ids_and_local_dirs(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    # A hub id in the HF cache resolves to itself, offline: a real cache layout, no network.
    repo = tmp_path / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    (repo / "snapshots" / ("0" * 40)).mkdir(parents=True)
    (repo / "snapshots" / ("0" * 40) / "config.json").write_text("{}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert HubModel("Qwen/Qwen2.5-0.5B-Instruct").resolve() == "Qwen/Qwen2.5-0.5B-Instruct"
    # One that is not cached and cannot be downloaded is one ConfigError with the fix.
    with pytest.raises(ConfigError, match=r"HF_HUB_OFFLINE is set.*hf download") as err:
        HubModel("Qwen/Qwen2.5-7B-Instruct").resolve()
    assert err.value.key == "name_or_path"
    assert HubModel(str(tiny_dir)).resolve() == str(tiny_dir)
    with pytest.raises(ConfigError) as err:
        HubModel(str(tiny_dir), revision="main")
    assert err.value.key == "revision"


def test_hub_model_loads_through_the_same_path(tiny_dir: Path) -> None:
    model, tok = load_causal_lm(
        HubModel(str(tiny_dir)).resolve(), device="cpu", dtype=torch.float32
    )
    assert model.config.vocab_size == len(tok)


def test_resolve_twice_does_not_rebuild(tmp_path: Path) -> None:
    spec = TinyModel(cache_dir=str(tmp_path), **QUICK)
    first = Path(spec.resolve())
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    assert spec.resolve() == str(first)
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temp dirs left


def test_concurrent_builder_keeps_the_winner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Two builds at once where the cache takes no locks (elsewhere the second waits: the
    build lock, test_model_cache.py): the one that renames first wins, the other keeps its."""
    spec = TinyModel(cache_dir=str(tmp_path / "first"), **QUICK)
    theirs = Path(spec.resolve())
    target = tmp_path / "second" / "models" / theirs.name

    def build(tmp: Path) -> None:  # while this one builds, another process publishes first
        shutil.copytree(theirs, target)  # copy2: their files' times
        build_tiny_model(tmp, spec)

    monkeypatch.setattr(model_cache, "file_lock", NoLocks)
    caplog.set_level(logging.INFO, logger=model_cache.__name__)
    build_atomically(target, build)
    assert f"another process built {target} first; keeping theirs" in caplog.text
    mtime = (theirs / "model.safetensors").stat().st_mtime_ns
    assert (target / "model.safetensors").stat().st_mtime_ns == mtime
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temp dir left


def test_cache_dir_and_fingerprint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    spec = TinyModel()
    assert spec.model_dir().parent == tmp_path / "models"
    assert spec.model_dir().name == f"tiny-{spec.fingerprint()}"
    assert TinyModel(cache_dir="/elsewhere").fingerprint() == spec.fingerprint()
    assert TinyModel(seed=1).fingerprint() != spec.fingerprint()
    assert isinstance(spec, ModelSpec)
    assert isinstance(HubModel("x/y"), ModelSpec)


def test_specs_load_nothing() -> None:
    code = (
        "import sys; from evolm.model import TinyModel, HubModel; TinyModel(); HubModel('a/b'); "
        "print(sorted(m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", sorted(p.stem for p in CONF_MODEL.glob("*.yaml")))
def test_model_yaml_instantiates(name: str) -> None:
    cfg = OmegaConf.load(CONF_MODEL / f"{name}.yaml")
    assert cfg.pop("defaults")[-1] == "_self_"
    if name in MODELS and locate(MODELS[name])[1]:  # optional weights, not installed
        with pytest.raises(ConfigError, match=f"make {MODELS[name].make_target} "):
            instantiate(cfg, _execution_whitelist_=["evolm.*"])
        return
    spec = instantiate(cfg, _execution_whitelist_=["evolm.*"])
    assert isinstance(spec, ModelSpec)
    if isinstance(spec, TinyModel):
        assert spec == TinyModel()


def test_warmed_up_model_answers_verbosely_then_stops(tiny_dir: Path) -> None:
    """The warm-up's purpose: answers that stop, many of them long (room for conciseness)."""
    from evolm.task.conciseness import Conciseness

    model, tok = load_causal_lm(str(tiny_dir), device="cpu", dtype=torch.float32)
    questions = [str(e.prompt) for e in Conciseness().eval_examples()]
    enc = tok(questions, return_tensors="pt", padding=True)
    out = model.generate(**enc, max_new_tokens=64, do_sample=False, pad_token_id=tok.pad_token_id)
    lengths = []
    for row in out[:, enc["input_ids"].shape[1] :].tolist():
        assert tok.eos_token_id in row, "an answer never stops"
        lengths.append(len(tok.decode(row[: row.index(tok.eos_token_id)])))
    assert sum(n >= 40 for n in lengths) >= len(lengths) / 2, f"not verbose: {lengths}"


@pytest.mark.slow
def test_countdown_warm_up_answers_in_format_then_stops(countdown_demo_dir: str) -> None:
    """With ``countdown_share`` the warm-up trains on evolm's generated puzzles (never the
    task's default test split): on held-out puzzles the model writes ``… </think>`` and then
    either ``<answer> … </answer>`` or nothing (``countdown_untagged``: half the worked answers
    end untagged), stops at EOS, copies numbers from the prompt, and some chains reach the
    target. Both endings occur, so ES has a format signal to climb from the start."""
    from evolm.task.countdown import Countdown
    from evolm.task.countdown.reward import countdown_reward

    model, tok = load_causal_lm(countdown_demo_dir, device="cpu", dtype=torch.float32)
    task = Countdown(eval_samples=100)
    examples = task.eval_examples()
    enc = tok([str(e.prompt) for e in examples], return_tensors="pt", padding=True)
    out = model.generate(**enc, max_new_tokens=64, do_sample=False, pad_token_id=tok.pad_token_id)
    completions = []
    for row in out[:, enc["input_ids"].shape[1] :].tolist():
        assert tok.eos_token_id in row, f"an answer never stops: {tok.decode(row)!r}"
        completions.append(tok.decode(row[: row.index(tok.eos_token_id)]))
    scores = task.score(examples, completions)
    formats = scores["format_reward"]
    assert sum(f in (0.1, 1.0) for f in formats) >= 0.95 * len(examples), completions[:3]
    tagged = sum(f == 1.0 for f in formats)
    assert 0.05 * len(examples) <= tagged <= 0.95 * len(examples), (tagged, completions[:5])
    copied = [  # worked answers that start with the puzzle's first number
        c.split()[0] == str(e.reference["numbers"][0])
        for c, e in zip(completions, examples, strict=True)
    ]
    assert sum(copied) >= 0.5 * len(examples), completions[:5]
    reached = [  # the chain inside <think> (``expr = value``) is a correct answer
        countdown_reward(
            f"x </think>\n<answer> {c.split('</think>')[0].rsplit('=', 1)[0]} </answer>",
            e.reference["numbers"],
            e.reference["target"],
        )["accuracy"]
        for c, e in zip(completions, examples, strict=True)
    ]
    assert sum(reached) > 0, completions[:5]


def test_default_tiny_model_has_no_countdown_warm_up() -> None:
    """countdown_share=0 (the default) reads no warm-up data: its key ignores any; with a
    share the key holds the data's fingerprint, and the data must be passed in (evolm.model
    imports no task)."""
    warmup = CountdownWarmup()
    assert TinyModel().fingerprint() == TinyModel().fingerprint(warmup)
    assert TinyModel(countdown_share=0.5).fingerprint(warmup) != TinyModel().fingerprint()
    untagged = TinyModel(countdown_share=0.5, countdown_untagged=0.5)
    assert untagged.fingerprint(warmup) != TinyModel(countdown_share=0.5).fingerprint(warmup)
    with pytest.raises(ValueError, match=r"pass warmup=CountdownWarmup\(\)"):
        TinyModel(countdown_share=0.5).model_dir()
    with pytest.raises(ConfigError, match="countdown_share"):
        TinyModel(countdown_share=1.5)
    with pytest.raises(ConfigError, match="countdown_untagged"):
        TinyModel(countdown_untagged=1.0)


def test_model_cache_key_covers_the_warm_up_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """A changed countdown prompt gives another model directory (a new build), never the stale
    model; the same data gives the same directory."""
    spec = TinyModel(**COUNTDOWN_TINY)
    before = spec.model_dir(CountdownWarmup())
    assert spec.model_dir(CountdownWarmup()) == before

    def reworded(numbers: list[int], target: int) -> str:
        return paper_prompt(numbers, target).replace("create an equation", "write an equation")

    monkeypatch.setattr(countdown_warmup, "paper_prompt", reworded)
    after = spec.model_dir(CountdownWarmup())
    assert after != before and after.parent == before.parent
    assert spec.model_dir(CountdownWarmup()) == after


def test_the_composition_root_passes_the_countdown_warm_up_data(tmp_path: Path) -> None:
    """evolm.app builds a countdown tiny model with the task's warm-up data (evolm.model cannot
    import it), into the directory that data's key names."""
    spec = TinyModel(cache_dir=str(tmp_path), countdown_share=0.5, **QUICK)
    assert resolve_model(spec) == str(spec.model_dir(CountdownWarmup()))
    assert is_built(spec.model_dir(CountdownWarmup()))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], {"warmup_steps": 200, "countdown_share": 0.0, "countdown_untagged": 0.0}),
        (["task=countdown"], COUNTDOWN_DEMO),
        (
            ["task=countdown", "model.countdown_untagged=0"],
            {**COUNTDOWN_DEMO, "countdown_untagged": 0},
        ),
        (["task=countdown", "model.warmup_steps=200"], COUNTDOWN_TINY),  # the tests' model
    ],
)
def test_tiny_model_warm_up_follows_the_task(overrides: list[str], expected: dict) -> None:
    """conf/model/tiny.yaml: ``task=countdown`` builds the countdown warm-up (the model the
    countdown tests use), every other task the plain one; a key set on the command line wins."""
    cfg = compose_config(overrides)
    assert {key: cfg.model[key] for key in expected} == expected


# A build in a fresh process whose CPU kernels the environment picks: ATEN_CPU_CAPABILITY
# chooses ATen's vectorized kernels, MKL_CBWR MKL's GEMM path (COMPATIBLE: its oldest instead
# of its per-CPU one), OMP_NUM_THREADS the threads, GLIBC_TUNABLES hides the CPU's AVX-512 from
# glibc's own dispatch: what differs between two x86-64 machines. ATen does not clamp the
# variable to the CPU (avx512 on a CPU without AVX-512 dies of SIGILL, seen on a CI machine), so
# the second machine asks for avx512 only where this CPU has it. ``pinned``: through
# evolm.model.tiny.pinned (what TinyModel.resolve runs), else in the calling process.
BUILD_IN_ENV = """
import hashlib, logging, sys, torch
from pathlib import Path
from evolm.model import TinyModel
from evolm.model.tiny import build as tiny
from evolm.model.tiny.pinned import build_pinned
from evolm.task.countdown.warmup import CountdownWarmup
tiny.WARMUP_DTYPE = getattr(torch, sys.argv[2])
spec = TinyModel(warmup_steps=60, countdown_share=0.75, countdown_untagged=0.5)
logging.basicConfig(level=logging.INFO, format="%(message)s")
builder = build_pinned if sys.argv[3] == "pinned" else tiny.build_tiny_model
out = Path(builder(Path(sys.argv[1]), spec, CountdownWarmup()))
print(torch.backends.cpu.get_cpu_capability(), hashlib.sha256(
    (out / "model.safetensors").read_bytes()).hexdigest())
"""
BUILD_PROCESS = re.compile(r"build process: ATen's (\w+) kernels, MKL_CBWR=(\S+), (\d+) thread")
WIDEST = "avx512" if torch.backends.cpu.get_cpu_capability() == "AVX512" else "avx2"
MACHINES = {
    "avx2, 1 thread, glibc without AVX-512": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "OMP_NUM_THREADS": "1",
        "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F,-AVX512DQ,-AVX512BW,-AVX512VL,-AVX512CD",
    },
    f"{WIDEST}, MKL compatible path, 2 threads": {
        "ATEN_CPU_CAPABILITY": WIDEST,
        "MKL_CBWR": "COMPATIBLE",
        "OMP_NUM_THREADS": "2",
    },
}


def build_in_env(
    out: Path, name: str, env: dict[str, str], dtype: str, pinned: bool
) -> tuple[str, str]:
    """``(ATen's kernel capability, sha256 of model.safetensors)`` of a build into ``out``: the
    build process's capability, MKL path and threads where it is pinned."""
    proc = subprocess.run(
        [sys.executable, "-c", BUILD_IN_ENV, str(out), dtype, "pinned" if pinned else "here"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"{name}: {proc.stderr[-3000:]}"
    capability, digest = proc.stdout.split()[-2:]
    if pinned:
        found = BUILD_PROCESS.search(proc.stderr)
        assert found is not None, proc.stderr[-3000:]
        capability = " ".join(found.groups())
    return capability, digest


def builds_in_envs(tmp_path: Path, dtype: str, pinned: bool) -> dict[str, tuple[str, str]]:
    """:func:`build_in_env` under every one of :data:`MACHINES`, side by side (each warm-up
    runs on one thread: the builds take both cores of a 2-core CI machine, not twice as long)."""
    tag = "pinned" if pinned else "here"
    with ThreadPoolExecutor(len(MACHINES)) as pool:
        futures = {
            name: pool.submit(
                build_in_env, tmp_path / f"{dtype}-{tag}-{i}", name, env, dtype, pinned
            )
            for i, (name, env) in enumerate(MACHINES.items())
        }
        return {name: f.result() for name, f in futures.items()}


@pytest.mark.slow
def test_pinned_build_bytes_do_not_depend_on_the_callers_cpu_kernels(tmp_path: Path) -> None:
    """Built through :func:`evolm.model.tiny.pinned.build_pinned` (what ``resolve`` runs), the
    countdown model comes from ATen's AVX2 kernels, MKL's ``COMPATIBLE,STRICT`` path and one thread,
    with the same bytes, whatever kernels, MKL path, threads and glibc dispatch its caller has.

    The control: those two environments do pick other kernels: in the calling process, a
    float32 warm-up gives two models under them wherever the CPU has AVX-512 (on an AVX2-only
    CPU both take the same kernels). A float64 warm-up of these 60 steps agrees there too, but
    800 did not (three models on one AMD EPYC): hence the pinning, and the reference bytes of
    the 800-step model below."""
    built = builds_in_envs(tmp_path, "float64", pinned=True)
    assert len({digest for _, digest in built.values()}) == 1, built
    kernels = {capability for capability, _ in built.values()}
    assert kernels == {"AVX2 COMPATIBLE,STRICT 1"}, built  # the build process's, not its caller's
    control = builds_in_envs(tmp_path, "float32", pinned=False)
    if {capability for capability, _ in control.values()} == {"AVX2"}:
        pytest.skip("no AVX-512 here: both builds ran the same ATen kernels")
    assert len({digest for _, digest in control.values()}) == 2, control


def test_pinned_build_raises_the_build_process_error(tmp_path: Path) -> None:
    """A build that fails in its process fails here, with that process's own message."""
    spec = TinyModel(warmup_steps=2, countdown_share=0.5)  # countdown steps, but no warm-up data
    with pytest.raises(RuntimeError, match=r"(?s)exit code 1.*pass warmup="):
        build_pinned(tmp_path / "out", spec, warmup=None)


PARENT_OF_A_BUILD = """
import sys
from pathlib import Path
from evolm.model import TinyModel
from evolm.model.tiny.pinned import build_pinned
build_pinned(Path(sys.argv[1]), TinyModel(warmup_steps=int(sys.argv[2])))
print("built")
"""


def test_the_build_process_imports_its_parents_evolm_not_the_working_directorys(
    tmp_path: Path,
) -> None:
    """A script run from a folder that holds another ``evolm`` (a checkout, a worktree): its
    build process imports the ``evolm`` the script did, not the folder's."""
    (tmp_path / "evolm").mkdir()
    (tmp_path / "evolm" / "__init__.py").write_text("raise ImportError('the wrong evolm')\n")
    script = tmp_path / "scripts" / "parent.py"
    script.parent.mkdir()
    script.write_text(PARENT_OF_A_BUILD)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out"), "2"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and "built" in proc.stdout, proc.stderr[-3000:]


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no one reaped counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_the_build_process_ends_when_its_parent_is_killed(tmp_path: Path) -> None:
    """SIGKILL of the process that asked for a build (no cleanup runs) ends the build too."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT_OF_A_BUILD, str(tmp_path / "out"), "100000"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    children: list[int] = []
    deadline = time.monotonic() + 60
    while not children and time.monotonic() < deadline:
        time.sleep(0.2)
        listed = Path(f"/proc/{parent.pid}/task/{parent.pid}/children")
        children = [int(pid) for pid in listed.read_text().split()] if listed.exists() else []
    assert children, "no build process started"
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 30
    while any(process_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(process_alive(pid) for pid in children)


def test_warm_up_data_of_main_is_refused_and_stray_lines_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The build process cannot import a class of ``__main__``: one clear error before it
    starts. A line of its output that is not a log record is logged as it is."""

    class Local:
        pass

    Local.__module__ = "__main__"
    with pytest.raises(TypeError, match="defined in __main__"):
        build_pinned(Path("unused"), TinyModel(warmup_steps=1), Local())  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="evolm.model.tiny.pinned"):
        pinned._relay(b"a line from a library\n")
        pinned._relay(b'{"name": "evolm.x", "level": 30, "msg": "a warning"}\n')
    assert "a line from a library" in caplog.text
    assert ("evolm.x", logging.WARNING, "a warning") in caplog.record_tuples


def test_a_cpu_without_avx2_builds_with_default_kernels_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(pinned, "has_avx2", lambda: False)
    with caplog.at_level(logging.WARNING, logger="evolm.model.tiny.pinned"):
        env = pinned.kernel_env()
    assert env["ATEN_CPU_CAPABILITY"] == "default" and env["MKL_CBWR"] == "COMPATIBLE,STRICT"
    assert "no AVX2" in caplog.text
    monkeypatch.setattr(pinned, "has_avx2", lambda: True)
    assert pinned.kernel_env()["ATEN_CPU_CAPABILITY"] == "avx2"


# The sha256 of model.safetensors of the models the tests build through TinyModel.resolve (the
# pinned build) with these versions: every x86-64 machine with AVX2 must build the same bytes,
# Intel or AMD. Until session 32 they differed by CPU vendor: the unfused AdamW's torch.sqrt went
# to MKL's vector math, which rounds ~1.4% of float64 square roots one ulp off, differently on
# an Intel Xeon and an AMD EPYC under the same pins. With the fused AdamW (ATen's own square
# root) a 200-step float64 warm-up gave the same weights on both (an Intel Xeon with AVX-512,
# torch 2.11, and the AMD EPYC Zen 3 below, torch 2.13). Other versions may round differently
# (their own bytes, their own demo numbers), so there the check is skipped.
REFERENCE_VERSIONS = {"torch": "2.13.0+cpu", "transformers": "5.25.0", "tokenizers": "0.23.3"}
REFERENCE_BUILDS = {  # each model's fixture: its sha256 (a 2-core AMD EPYC, Zen 3)
    "tiny_model_dir": "5d08b532b73289ef059d38cc59edcb15422a0dcbc611aec0bf9bf6404a4f9aac",
    "countdown_model_dir": "0f43243ba7c822a4b8c5fcc524c935ad74c9e2e95b2538aea74d21c9a7491d57",
    "countdown_demo_dir": "d82e3c3a5c30a46b283e523566e65fa9b8574813f618c8e110f59669a69add69",
}


def installed_versions() -> dict[str, str]:
    import tokenizers
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }


needs_reference = pytest.mark.skipif(
    installed_versions() != REFERENCE_VERSIONS or not pinned.has_avx2(),
    reason=f"the reference builds were made with {REFERENCE_VERSIONS} and AVX2 kernels",
)


def assert_reference_bytes(fixture: str, model_dir: str) -> None:
    digest = sha256(Path(model_dir) / "model.safetensors")
    want = REFERENCE_BUILDS[fixture]
    assert digest == want, (
        f"this machine ({torch.backends.cpu.get_cpu_capability()}) built another model "
        f"({fixture}) than the reference ({digest[:16]} vs {want[:16]}) with the same versions: "
        "the pinned build (evolm.model.tiny.pinned) is not portable to it"
    )


# Each names its fixture (not fetched by name), so that conftest runs this module after the
# background builds of the models instead of waiting for them mid-suite.
@needs_reference
def test_the_default_tiny_model_has_the_reference_bytes(tiny_model_dir: str) -> None:
    """The default demo's model: this machine runs the same demo as every other."""
    assert_reference_bytes("tiny_model_dir", tiny_model_dir)


@needs_reference
def test_the_tests_countdown_model_has_the_reference_bytes(countdown_model_dir: str) -> None:
    """The tests' countdown model (a quarter of the demo's warm-up, its code and data)."""
    assert_reference_bytes("countdown_model_dir", countdown_model_dir)


@needs_reference
@pytest.mark.slow  # make test-all: 13-17 minutes of one core (CI: the tests' countdown model)
def test_the_countdown_demos_model_has_the_reference_bytes(countdown_demo_dir: str) -> None:
    """The countdown demo's model (``python -m evolm task=countdown``, 800 warm-up steps)."""
    assert_reference_bytes("countdown_demo_dir", countdown_demo_dir)


def test_warm_up_eta_weighs_each_kind_of_step() -> None:
    """Issue 40 item 6: the build's progress lines say how long is left. A kind of step not run
    yet is costed by its work relative to the steps done (a full-prompt countdown step costs
    about 1.6 short ones), a kind that has run by its own mean time."""
    import math

    from evolm.model.tiny.eta import Eta, duration, step_work

    work = {"short": step_work(32, 80), "full": step_work(16, 192), "qa": step_work(16, 64)}
    assert 1.5 < work["full"] / work["short"] < 1.7
    eta = Eta(["short"] * 4 + ["full", "qa"] * 2, work)
    assert math.isnan(eta.seconds_left()) and duration(eta.seconds_left()) == "?"
    for _ in range(2):
        eta.step("short", 1.0)
    per_work = 1.0 / work["short"]
    expected = 2 + 2 * work["full"] * per_work + 2 * work["qa"] * per_work
    assert eta.seconds_left() == pytest.approx(expected)
    for _ in range(2):
        eta.step("short", 1.0)
    eta.step("full", 3.0)
    per_work = 7.0 / (4 * work["short"] + work["full"])
    assert eta.seconds_left() == pytest.approx(3.0 + 2 * work["qa"] * per_work)
    assert [duration(s) for s in (0.4, 42, 200, 3900)] == [
        "0 s",
        "42 s",
        "3 min 20 s",
        "1 h 05 min",
    ]
