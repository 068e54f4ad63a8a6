"""``python -m evolm.export``: the command's entry point, kept under its name; the command is
:mod:`evolm.cli.export`."""

import sys

from evolm.cli.export import main

if __name__ == "__main__":
    sys.exit(main())
