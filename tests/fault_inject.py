"""``python -m tests.fault_inject POINT N [evolm args...]``: run ``python -m evolm ARGS`` and
SIGKILL it at the ``N``-th time it reaches ``POINT`` (1-based), in the middle of what it does there.

Nothing in evolm knows about this: the points are the real functions, wrapped here before the
app starts. Used by tests/test_faults.py (kill, then ``resume``: the final adapter must be
byte-identical to an uninterrupted run's).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def half_write(path: Path, data: bytes) -> None:
    """A file cut off mid-write, as a kill during ``write`` leaves it."""
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
        f.flush()
        os.fsync(f.fileno())


def counter(n: int) -> Callable[[], bool]:
    calls = [0]

    def hit() -> bool:
        calls[0] += 1
        return calls[0] == n

    return hit


def install(point: str, n: int) -> None:
    import evolm.callbacks.mlflow as mlf
    import evolm.callbacks.plot as cbplot
    import evolm.callbacks.results as cbs
    import evolm.checkpoint as ck
    import evolm.files as files
    import evolm.lora.peft_io as peft_io
    from evolm.es import ES
    from evolm.loop import ESLoop

    hit = counter(n)
    atomic_write, prune, save_file = ck.atomic_write, ck.prune, peft_io.save_file

    def wrap(obj: Any, name: str, before: Callable[..., None]) -> None:
        real = getattr(obj, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            before(*args, **kwargs)
            return real(*args, **kwargs)

        setattr(obj, name, wrapped)

    if point == "checkpoint-data":  # the .pt's temp file half written

        def write(path: Path, data: bytes) -> None:
            if path.suffix == ".pt" and hit():
                half_write(path.with_name(f".{path.name}.tmp"), data)
                die()
            atomic_write(path, data)

        ck.atomic_write = write
    elif point == "checkpoint-digest":  # the .pt in place, its digest not yet

        def write_digest(path: Path, data: bytes) -> None:
            if path.suffix == ".sha256" and hit():
                half_write(path.with_name(f".{path.name}.tmp"), data)
                die()
            atomic_write(path, data)

        ck.atomic_write = write_digest
    elif point == "prune":  # an old checkpoint's digest deleted, the .pt not yet

        def pruning(directory: Path, keep: int) -> None:
            old = ck.checkpoints(directory)[:-keep]
            if old and hit():
                old[0][1].with_name(old[0][1].name + ".sha256").unlink()
                die()
            prune(directory, keep)

        ck.prune = pruning
    elif point == "adapter-weights":  # the final adapter's safetensors half written

        def save(tensors: Any, filename: str, metadata: Any = None) -> None:
            if hit():
                save_file(tensors, filename, metadata=metadata)
                data = Path(filename).read_bytes()
                half_write(Path(filename), data)
                die()
            save_file(tensors, filename, metadata=metadata)

        peft_io.save_file = save
    elif point == "adapter-rename":  # the adapter complete in its temp dir, not renamed yet
        # evolm.files.publish_dir renames the temp dir onto adapter/ (os.rename when new,
        # os.replace when an older adapter is there): both are patched (the os module's own)
        replace, rename = os.replace, os.rename

        def renaming(move: Any) -> Any:
            def renamed(src: Any, dst: Any) -> None:
                if Path(dst).name == "adapter" and hit():
                    die()
                move(src, dst)

            return renamed

        files.os.replace = renaming(replace)  # type: ignore[assignment]
        files.os.rename = renaming(rename)  # type: ignore[assignment]
    elif point == "results":  # results.jsonl's last line half written

        def append(self: Any, ctx: Any, record: Any, state: Any) -> None:
            line = cbs.json_line(record.as_record())
            if hit():
                with open(Path(ctx.output_dir) / self.filename, "a") as f:
                    f.write(line[: len(line) // 2])
                die()
            with open(Path(ctx.output_dir) / self.filename, "a", encoding="utf-8") as f:
                f.write(line)

        cbs.ResultsWriter.on_generation_end = append  # type: ignore[method-assign]
    elif point == "generate":  # after the population generated, before the ES update
        wrap(ES, "tell", lambda *a, **k: die() if hit() else None)
    elif point == "eval":  # while the mean is evaluated
        wrap(ESLoop, "evaluate_mean", lambda *a, **k: die() if hit() else None)
    elif point == "mlflow":  # while a generation's metrics go to MLflow
        wrap(mlf, "_log_metrics", lambda *a, **k: die() if hit() else None)
    elif point == "plot":  # while the figure is drawn
        wrap(cbplot, "plot_evolution", lambda *a, **k: die() if hit() else None)
    else:
        raise SystemExit(f"unknown fault point {point!r}")


if __name__ == "__main__":
    point, n, *args = sys.argv[1:]
    install(point, int(n))
    sys.argv = ["evolm", *args]
    from evolm.__main__ import main

    main()
