"""Where and under which names a server engine stages its members' adapters.

Files: ``/dev/shm/evolm-<pid>/<run>/g<gen>/m<member>`` (the temp directory where there is no
/dev/shm), in PEFT format. Engines delete their folders on close; what a killed process left
behind is removed by the next engine that starts, and this process's folder once more at exit.

Names: ``{run}-g{gen:04d}-m{member:03d}``, unique per engine (random ``run``) and generation:
SGLang silently reloads an unloaded name from its old path, so a name is never reused.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from evolm.lora.layout import LoraPopulation
from evolm.lora.peft_io import save_adapter

_AT_EXIT: set[Path] = set()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def adapter_root(run: str) -> Path:
    """The adapter folder of one engine (``run``: its random id) in this process."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    for folder in base.glob("evolm-*"):
        pid = folder.name.removeprefix("evolm-")
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
    mine = base / f"evolm-{os.getpid()}"
    if mine not in _AT_EXIT:
        # atexit runs after the executor threads are joined, so it also removes what a write
        # still in flight at Ctrl-C created after the engine had cleaned up.
        _AT_EXIT.add(mine)
        atexit.register(shutil.rmtree, mine, True)
    return mine / run


Map = Callable[[Callable[..., Any], list[tuple[Any, ...]]], list[Any]]
"""Runs ``fn(*args)`` for every args tuple (the engine's thread pool), returning the results."""


class AdapterStage:
    """One engine's staged adapters: a generation's members written, named and removed."""

    def __init__(self, run: str, base_model: str, dtype: torch.dtype = torch.float32) -> None:
        self.run, self.base_model, self.dtype = run, base_model, dtype
        self.root = adapter_root(run)

    def names(self, generation: int, members: int) -> list[str]:
        return [f"{self.run}-g{generation:04d}-m{m:03d}" for m in range(members)]

    def folder(self, generation: int) -> Path:
        return self.root / f"g{generation:04d}"

    def write(self, generation: int, adapters: LoraPopulation, map_: Map) -> list[str]:
        """Write every member's adapter (in parallel through ``map_``); their paths."""
        folder = self.folder(generation)
        return map_(
            self._write, [(folder / f"m{m:03d}", adapters, m) for m in range(len(adapters))]
        )

    def _write(self, path: Path, adapters: LoraPopulation, member: int) -> str:
        tensors = adapters.member(member)
        return str(save_adapter(path, adapters.layout, tensors, self.base_model, self.dtype))

    def remove(self, generation: int) -> None:
        shutil.rmtree(self.folder(generation), ignore_errors=True)

    def close(self) -> None:
        """Delete every staged file of this engine (and the process folder once it is empty)."""
        shutil.rmtree(self.root, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.root.parent.rmdir()
