"""``results.jsonl``: every generation's record as one JSON line."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from evolm.callbacks.base import Callback, RunContext
from evolm.callbacks.record import GenerationRecord, Record
from evolm.es import ESState


def json_line(record: Record) -> str:
    """One JSON line; non-finite floats become null."""
    clean = {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()
    }
    return json.dumps(clean) + "\n"


class ResultsWriter(Callback):
    """Appends every record to ``<run dir>/<filename>`` as one JSON line, flushed at once.

    At the start the file is rewritten with ``ctx.history``: empty for a fresh run, and for a
    resumed run the checkpoint's records, which truncates whatever the interrupted run wrote
    after its checkpoint (no duplicate generations).
    """

    def __init__(self, filename: str = "results.jsonl") -> None:
        self.filename = filename

    def on_run_start(self, ctx: RunContext, state: ESState) -> None:
        path = Path(ctx.output_dir) / self.filename
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(json_line(r) for r in ctx.history), encoding="utf-8")
        os.replace(tmp, path)

    def on_generation_end(self, ctx: RunContext, record: GenerationRecord, state: ESState) -> None:
        with open(Path(ctx.output_dir) / self.filename, "a", encoding="utf-8") as f:
            f.write(json_line(record.as_record()))
