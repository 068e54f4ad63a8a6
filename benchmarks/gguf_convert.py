"""``python -m benchmarks.gguf_convert``: a packaged model's first-use conversion (GGUF ->
safetensors checkpoint), parsing the file once vs once per reader as transformers does.

The conversion runs on every fresh machine before the first run, a GPU lease's included (the
0.5B's took ~95 s of held time there). transformers parses the GGUF's fields for the config,
the tokenizer and the weights, and evolm's tokenizer check once more; a parse of Qwen2.5's
151,665 token strings is most of the time. ``evolm.model.gguf.convert_gguf`` now shares one
parse per file (``_one_reader_per_file``). Both ways, alternating, ``--repeat`` times each in this
process (imports done first), into fresh folders; best of each; the written files are checked
byte-equal.

    make install-qwen05 && PYTHONPATH=. python -m benchmarks.gguf_convert --gguf FILE
    (``python -m evolm.model.gguf.join qwen2.5-coder-0.5b-instruct --out FILE`` writes FILE)
"""

from __future__ import annotations

import argparse
import contextlib
import filecmp
import json
import platform
import tempfile
import time
from pathlib import Path
from unittest import mock

import evolm.model.gguf as gguf_model


def convert(gguf: Path, out: Path, dtype: str, shared: bool) -> float:
    """Seconds to convert ``gguf`` into ``out`` (``shared``: one parse per file, as evolm now)."""
    patch = (
        contextlib.nullcontext()
        if shared
        else mock.patch.object(gguf_model, "_one_reader_per_file", contextlib.nullcontext)
    )
    start = time.perf_counter()
    with patch:
        gguf_model.convert_gguf(gguf, out, dtype)
    return time.perf_counter() - start


def cpu_name() -> str:
    """The CPU's model name and count (``/proc/cpuinfo``), else what ``platform`` says."""
    with contextlib.suppress(OSError):
        names = [
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ]
        if names:
            return f"{names[0]}, {len(names)} CPUs"
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, required=True, help="the (joined) GGUF file")
    parser.add_argument("--dtype", default="bfloat16", help="the checkpoint's (Qwen: bfloat16)")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    import gguf  # noqa: F401  (imports out of the timings)
    import transformers  # noqa: F401

    times: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for name in times:
                out = Path(tmp, f"{name}-{i}")
                times[name].append(convert(args.gguf, out, args.dtype, shared=name == "after"))
        files = sorted(p.name for p in Path(tmp, "before-0").iterdir())
        same = filecmp.cmpfiles(Path(tmp, "before-0"), Path(tmp, "after-0"), files, shallow=False)
    before, after = min(times["before"]), min(times["after"])
    record = {
        "machine": cpu_name(),
        "gguf": str(args.gguf),
        "times_s": {name: [round(t, 2) for t in ts] for name, ts in times.items()},
        "before_s": round(before, 2),
        "after_s": round(after, 2),
        "ratio": round(before / after, 2),
        "files_equal": same[0] == files,
    }
    print(json.dumps(record))
    return 0 if record["files_equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
