"""Every rank of a distributed run composed the same run and read the same data; a resumed run
reads the data its checkpoint was trained on.

Each rank composes its own config (its own command line, config files and environment
variables: ``task.train_file=${oc.env:DATA}``) and reads its own data files (a node's own
disk). A rank that differs would train on its own prompts while the ES update mixes every
rank's scores (or crash mid-run when its data has another length). :func:`check_ranks_agree`
all-gathers, before any model loads, what each rank's run depends on (the task's and every
extra eval's config and data) and stops every rank alike with a
:class:`~evolm.errors.ConfigError` naming the differing ranks and values.

A data file edited or replaced between a stop and ``resume=`` would silently change what the
run trains on: :func:`check_resumed_data` compares the data's fingerprints with those the
checkpoint recorded and refuses the resume, or, with ``resume_on_new_data=true``, warns and
records the change.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from evolm.checkpoint import Checkpoint, data_changes
from evolm.dist import Comm
from evolm.errors import ConfigError
from evolm.task.base import Task, run_examples

log = logging.getLogger(__name__)


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


def data_fingerprints(
    task: Task, generations: int, extra_evals: Mapping[str, Task]
) -> dict[str, str]:
    """:func:`data_fingerprint` by part: ``task`` (its eval split and training prompts) and
    ``extra_evals.<name>`` (the eval split of each extra eval, all it reads)."""
    extra = {f"extra_evals.{name}": data_fingerprint(t, 0) for name, t in extra_evals.items()}
    return {"task": data_fingerprint(task, generations), **extra}


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


def check_ranks_agree(comm: Comm, config: Mapping[str, Any], data: Mapping[str, str]) -> None:
    """Raise a ConfigError on every rank unless all ranks hold the same ``config`` (the
    flattened config the run's course depends on: :func:`evolm.checkpoint.run_identity`, the
    extra evals' and the run-wide keys) and the same ``data`` (:func:`data_fingerprints`)."""
    if comm.world_size == 1:
        return
    every = comm.gather((dict(config), dict(data)))
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
    data_differ = _differences([d for _, d in every])
    if data_differ:
        part, ranks = next(iter(data_differ.items()))
        prints = [d.get(part, "<none>")[:12] for _, d in every]
        raise ConfigError(
            part,
            f"ranks {ranks} read other prompts than rank 0 from the same config "
            f"(data fingerprints {prints}): their data files differ",
            "give every node the same data files (or point the task's file keys at a shared path)",
        )


def check_resumed_data(
    checkpoint: Checkpoint,
    data: Mapping[str, str],
    files: Mapping[str, Mapping[str, Any]],
    accept: bool,
) -> list[dict[str, Any]]:
    """The data changes the resumed run has accepted, this one included: a ConfigError naming
    the part's data file key (``files``: each part's ``*_file`` keys and values) when ``data``
    (:func:`data_fingerprints`) differs from what ``checkpoint`` was trained on, unless
    ``accept`` (``resume_on_new_data=true``): then a warning, and the change is recorded."""
    changed = data_changes(checkpoint, data)
    if not changed:
        return list(checkpoint.data_changes)
    part = changed[0]
    named = files.get(part, {})
    key = next(iter(named), part)
    read = ", ".join(f"{k}={v}" for k, v in named.items()) or "the data it generates"
    problem = (
        f"the prompts {part} reads ({read}) differ from those checkpoint {checkpoint.path} was "
        f"trained on (data fingerprint {checkpoint.data[part][:12]}, now {data[part][:12]}): "
        "the data was edited or replaced since the run stopped"
        + (f" (also changed: {changed[1:]})" if changed[1:] else "")
    )
    if not accept:
        raise ConfigError(
            key,
            problem,
            "put back the data the run was trained on, or start a new run on the new data, "
            "or continue this run on it anyway with resume_on_new_data=true (warned, and "
            "recorded in its checkpoints and MLflow run)",
        )
    log.warning("%s: %s; the run continues on it (resume_on_new_data=true)", key, problem)
    new = [
        {"generation": checkpoint.generation, "part": p, "was": checkpoint.data[p], "now": data[p]}
        for p in changed
    ]
    return [*checkpoint.data_changes, *new]


def changes_tag(changes: list[dict[str, Any]]) -> dict[str, str]:
    """The run tag that records accepted data changes (``evolm.data_changed``; none: {})."""
    if not changes:
        return {}
    text = "; ".join(
        f"generation {c['generation']}: {c['part']} {str(c['was'])[:12]} -> {str(c['now'])[:12]}"
        for c in changes
    )
    return {"evolm.data_changed": text}
