"""Every rank of a distributed run composed the same run and read the same data.

Each rank composes its own config (its own command line, config files and environment
variables: ``task.train_file=${oc.env:DATA}``) and reads its own data files (a node's own
disk). A rank that differs would train on its own prompts while the ES update mixes every
rank's scores (or crash mid-run when its data has another length). :func:`check_ranks_agree`
all-gathers, before any model loads, what each rank's run depends on and stops every rank alike
with a :class:`~evolm.errors.ConfigError` naming the differing ranks and values.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from evolm.dist import Comm
from evolm.errors import ConfigError
from evolm.task.base import Task, run_examples


def data_fingerprint(task: Task, generations: int) -> str:
    """SHA-256 of the prompts and references the run uses (:func:`~evolm.task.base.run_examples`:
    the eval split and the training prompts of each generation, up to 1,000)."""
    digest = hashlib.sha256()
    for generation, examples in run_examples(task, generations):
        digest.update(b"generation %d\n" % generation)
        for example in examples:
            content = {k: v for k, v in asdict(example).items() if k != "source"}  # not where
            digest.update(json.dumps(content, sort_keys=True, default=repr).encode() + b"\n")
    return digest.hexdigest()


def _differences(every: list[Mapping[str, Any]]) -> dict[str, list[int]]:
    """The keys whose value differs from rank 0's, with the ranks that differ."""
    keys = sorted(set().union(*every))
    unset = "<unset>"
    found: dict[str, list[int]] = {}
    for key in keys:
        ranks = [r for r, d in enumerate(every) if d.get(key, unset) != every[0].get(key, unset)]
        if ranks:
            found[key] = ranks
    return found


def check_ranks_agree(comm: Comm, config: Mapping[str, Any], task: Task, generations: int) -> None:
    """Raise a ConfigError on every rank unless all ranks hold the same ``config`` (the
    flattened config the run's course depends on: :func:`evolm.checkpoint.run_identity` and
    the run-wide keys) and the same data (:func:`data_fingerprint` of ``task``)."""
    if comm.world_size == 1:
        return
    every = comm.gather((dict(config), data_fingerprint(task, generations)))
    differ = _differences([c for c, _ in every])
    if differ:
        key = next(iter(differ))
        values = ", ".join(f"{every[r][0].get(key)!r} on rank {r}" for r in [0, *differ[key]])
        others = [k for k in differ if k != key]
        more = f" (also differing: {others[:5]})" if others else ""
        raise ConfigError(
            key,
            f"ranks {sorted({r for rs in differ.values() for r in rs})} composed another run "
            f"than rank 0: {values}{more}",
            "launch every rank with the same command line, config files and the environment "
            "variables the config reads",
        )
    prints = [p for _, p in every]
    data_differ = [r for r, p in enumerate(prints) if p != prints[0]]
    if data_differ:
        raise ConfigError(
            "task",
            f"ranks {data_differ} read other prompts than rank 0 from the same config "
            f"(data fingerprints {[p[:12] for p in prints]}): their data files differ",
            "give every node the same data files (or point the task's file keys at a shared path)",
        )
