"""What the mean now says: a few eval completions written at every evaluation of the mean."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from evolm.callbacks.base import Callback, RunContext, Sample
from evolm.callbacks.results import json_line
from evolm.checkpoint import atomic_write
from evolm.errors import ConfigError


class SampleWriter(Callback):
    """At every evaluation of the mean, writes its first ``count`` eval prompts, with the
    mean's completion and the task's scores, to ``<run dir>/<dirname>/gen-<generation>.jsonl``
    (one JSON object a line: ``generation``, ``prompt``, ``completion``, ``scores``; written
    atomically, the generation zero-padded so the files sort), and each extra eval set's
    (e.g. countdown's template-free held-out sets) first ``count`` to
    ``<dirname>/<set>/gen-<generation>.jsonl``. The MLflow logger uploads the folder at the end
    (``logger.mlflow.artifacts``). In a distributed run: rank 0's prompts.

    Args:
        count: prompts per evaluation (0: none).
        dirname: the folder in the run directory.
        token_ids: also write each completion's generated token ids (``token_ids``, EOS not
            included), where the engine says them (the local engine): what two runs' answers
            are compared by (``python -m benchmarks.near_ties``) without tokenizing them again.
    """

    def __init__(self, count: int = 4, dirname: str = "samples", token_ids: bool = False) -> None:
        if count < 0:
            raise ConfigError("count", f"must be >= 0, got {count}", "e.g. 4 (0: off)")
        self.count, self.dirname, self.token_ids = count, dirname, token_ids

    def on_eval(self, ctx: RunContext, generation: int, samples: Sequence[Sample]) -> None:
        self.write(Path(ctx.output_dir), generation, ctx.generations, samples)

    def write(
        self, run_dir: Path, generation: int, generations: int, samples: Sequence[Sample]
    ) -> None:
        """The first ``count`` of each eval set's ``samples`` to
        ``<run_dir>/<dirname>[/<set>]/gen-<generation>.jsonl`` (``generations``: the run's cap,
        which sets the zero-padding)."""
        if not self.count:
            return
        by_set: dict[str, list[Sample]] = {}
        for s in samples:
            by_set.setdefault(s.eval_set, []).append(s)
        width = len(str(generations))
        for name, rows in by_set.items():
            folder = run_dir / self.dirname / name if name else run_dir / self.dirname
            lines = [json_line(self.line(generation, s)) for s in rows[: self.count]]
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write(folder / f"gen-{generation:0{width}d}.jsonl", "".join(lines).encode())

    def line(self, generation: int, sample: Sample) -> dict[str, object]:
        """One sample's JSON object (``token_ids`` with the option, where the engine says them)."""
        out: dict[str, object] = {
            "generation": generation,
            "prompt": sample.prompt,
            "completion": str(sample.completion),
            "scores": sample.scores,
        }
        ids = getattr(sample.completion, "token_ids", None)
        if self.token_ids and ids is not None:
            out["token_ids"] = list(ids)
        return out
