"""Peak memory of a training process, written beside its ``results.jsonl`` the same way for
both methods: ``peak_memory.json`` ``{"peak_gb": ..., "device": "cuda" | "cpu", "name": the
GPU's name or "cpu", "what": ...}`` (timings compare only on the same card).

On a GPU it is torch's peak of allocated memory (``torch.cuda.max_memory_allocated``); on a
CPU the process's peak resident set (``ru_maxrss``), which is all a CPU run can say.
"""

from __future__ import annotations

import json
import resource
from pathlib import Path

import torch

from evolm.callbacks import Callback, GenerationRecord, RunContext
from evolm.es import ESState

FILE = "peak_memory.json"
GiB = 2**30


def peak_gb() -> tuple[float, str]:
    """``(peak GiB, device kind)`` of this process so far."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / GiB, "cuda"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GiB, "cpu"  # KiB on Linux


def write_peak(run_dir: str | Path, peak: float, device: str, what: str) -> None:
    path = Path(run_dir) / FILE
    tmp = path.with_name(f".{FILE}.tmp")
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    record = {"peak_gb": peak, "device": device, "name": name, "what": what}
    tmp.write_text(json.dumps(record) + "\n")
    tmp.replace(path)


def read_peak(run_dir: str | Path) -> dict[str, float | str] | None:
    path = Path(run_dir) / FILE
    return json.loads(path.read_text()) if path.is_file() else None


class PeakMemory(Callback):
    """An evolm callback (``+callbacks.peak_memory._target_=baselines.memory.PeakMemory``,
    with ``baselines.*`` in ``trusted_targets``) that keeps ``peak_memory.json`` up to date
    after every generation: the whole ES process (its evals reuse the training engine)."""

    def on_generation_end(self, ctx: RunContext, record: GenerationRecord, state: ESState) -> None:
        peak, device = peak_gb()
        write_peak(ctx.output_dir, peak, device, "the ES process, evals included")
