"""How far templates go on a Countdown data set: the table of docs/tasks.md, recomputable.

``python -m evolm.task.countdown.stats [--data-file FILE] [--generator tree|uniform] [--seed 0]``
builds the task as a run would (the same ``task.*`` arguments, the whole test split) and prints one
Markdown row per split: the share of its puzzles each named template solves, the best size-order
rule's, the best first-negated rule's and the best fixed rule's accuracy (per puzzle size), the
template-solvable share, and the share of each puzzle family
(:mod:`evolm.task.countdown.shortcuts`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from evolm import metrics as M
from evolm.errors import ConfigError
from evolm.task.base import Example
from evolm.task.countdown import Countdown
from evolm.task.countdown.shortcuts import FAMILIES, TEMPLATES
from evolm.task.countdown.summary import BY_SIZE, FIRST_NEGATED, family_shares, puzzle_rates

COLUMNS = (
    *(M.shortcut(t) for t in TEMPLATES),
    M.shortcut(BY_SIZE),
    M.shortcut(FIRST_NEGATED),
    M.SHORTCUT_ACCURACY,
    M.TEMPLATE_SOLVABLE_SHARE,
)
HEADER = (
    "| source | split | puzzles | sum | product | chain_sub | chain_div | best by size "
    f"| best first-negated | best rule | template-solvable | {' | '.join(FAMILIES)} |"
)


def split_row(task: Countdown, examples: Sequence[Example], source: str, split: str) -> str:
    """One Markdown row: ``examples``' template rates and family shares, in percent."""
    infos = [task.puzzle_info(e) for e in examples]
    rates, families = puzzle_rates(infos), family_shares(infos)
    cells = [f"{100 * rates[c]:.1f}%" for c in COLUMNS]
    cells += [f"{100 * families[f]:.1f}%" for f in FAMILIES]
    return f"| {source} | {split} | {len(infos)} | {' | '.join(cells)} |"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m evolm.task.countdown.stats", description=__doc__
    )
    parser.add_argument("--data-file", help="a Countdown JSON file (default: generated puzzles)")
    parser.add_argument("--generator", default="tree", help="tree or uniform (generated only)")
    parser.add_argument("--seed", type=int, default=0, help="the generator's seed")
    parser.add_argument("--train-size", type=int, default=200)
    parser.add_argument("--generate-count", type=int, default=400)
    parser.add_argument("--drop-templates", default=None, help="train, test or both")
    parser.add_argument("--header", action="store_true", help="print the table's header first")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the rows of the training and the test split; exit 2 on a bad argument."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        task = Countdown(
            data_file=args.data_file,
            train_size=args.train_size,
            generate_count=args.generate_count,
            seed=args.seed,
            generator=args.generator,
            drop_templates=args.drop_templates,
            samples_per_generation=1,
            eval_samples=None,
        )
    except ConfigError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    source = args.data_file or f"{args.generator}, seed {args.seed}"
    rows = [HEADER, "|---" * HEADER.count(" | ") + "|---|"] if args.header else []
    rows += [
        split_row(task, task.train, source, "train"),
        split_row(task, task.eval_examples(), source, "test"),
    ]
    sys.stdout.write("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
