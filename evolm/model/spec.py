"""Model specs: cheap, frozen config objects that name a model and resolve it to a directory.

Constructing a spec loads nothing. ``resolve()`` returns what to pass to ``from_pretrained``: a
hub id or a local directory. A :class:`HubModel` names an existing checkpoint; a
:class:`~evolm.model.tiny.TinyModel` builds itself (offline, deterministically) and a
:class:`~evolm.model.gguf.GGUFModel` converts a packaged GGUF, each once, into the model cache
(:mod:`evolm.model.cache`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from evolm.errors import ConfigError


@runtime_checkable
class ModelSpec(Protocol):
    """Anything that names a causal LM: ``resolve()`` gives the path for ``from_pretrained``."""

    def resolve(self) -> str: ...


@dataclass(frozen=True)
class HubModel:
    """A pretrained checkpoint: a hub id (``Qwen/Qwen2.5-0.5B-Instruct``) or a local directory."""

    name_or_path: str
    revision: str | None = None

    def __post_init__(self) -> None:
        if not self.name_or_path:
            raise ConfigError("name_or_path", "is empty", "name a hub id or a local directory")
        if self.revision is not None and self.is_local:
            raise ConfigError(
                "revision",
                f"pins a hub revision, but {self.name_or_path!r} is a local path",
                "remove revision (set it to null) or use a hub id",
            )

    @property
    def is_local(self) -> bool:
        return self.name_or_path.startswith(("/", ".", "~"))

    def resolve(self) -> str:
        """The name or path for ``from_pretrained``.

        A local path must exist. A hub id is returned as is, unless ``revision`` pins one: then
        the snapshot of that revision is fetched (or found in the HF cache) and its directory
        returned, so every loader reads the same files.
        """
        if self.is_local:
            path = Path(self.name_or_path).expanduser()
            if not path.is_dir():
                raise ConfigError(
                    "name_or_path",
                    f"local model directory {str(path)!r} does not exist",
                    "point it at a directory holding config.json, or use a hub id",
                )
            return str(path.resolve())
        if self.revision is None:
            self._fetch(allow_patterns=["config.json"])  # on disk, or reachable: else one error
            return self.name_or_path
        return self._fetch()

    def _fetch(self, allow_patterns: list[str] | None = None) -> str:
        """The hub snapshot's directory, from the HF cache or downloaded; a model that is not
        on disk and cannot be downloaded (offline, no network) is a ConfigError."""
        from huggingface_hub import snapshot_download

        try:
            return snapshot_download(
                self.name_or_path, revision=self.revision, allow_patterns=allow_patterns
            )
        except (OSError, ValueError) as e:  # LocalEntryNotFoundError, HTTP and hub errors
            offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false")
            why = "HF_HUB_OFFLINE is set" if offline else str(e).splitlines()[0][:300]
            raise ConfigError(
                "name_or_path",
                f"hub model {self.name_or_path!r} is not on disk (HF cache) and cannot be "
                f"downloaded ({why})",
                f"download it where there is network (`hf download {self.name_or_path}`, "
                "into the HF cache), or set model.name_or_path=/path/to/a/local/copy"
                + (", or unset HF_HUB_OFFLINE to allow downloads" if offline else ""),
            ) from None
