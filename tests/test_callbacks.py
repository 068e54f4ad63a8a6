"""Callbacks: the typed record they get (docs/callbacks.md's example, run for real) and the
clear error for a ``_target_`` that moved to evolm.callbacks."""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import torch
from hydra.utils import get_class
from omegaconf import OmegaConf

from evolm.app import train
from evolm.app.resume import resumed_config
from evolm.callbacks import Callback
from evolm.callbacks.base import RunContext
from evolm.callbacks.record import GenerationRecord, Record
from evolm.callbacks.writer import BEST_FILE, MeanWriter
from evolm.errors import ConfigError
from evolm.es import ESState
from evolm.preflight.trust import MOVED
from tests.conftest import SHORT_RUN
from tests.helpers import REPO, compose_config, read_results, run_cli


def docs_example() -> str:
    """The Python block of docs/callbacks.md (the example callback)."""
    text = (REPO / "docs" / "callbacks.md").read_text()
    [code] = re.findall(r"```python\n(.*?)```", text, re.S)
    return code


@pytest.mark.slow  # make test-all
def test_the_docs_example_callback_gets_typed_records(tmp_path: Path, tiny_model_dir: str) -> None:
    """docs/callbacks.md's BestEval, in a module of its own, added from the command line as the
    docs say: it reads the typed record (``eval_reward``, ``es``) of a real run."""
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "best.py").write_text(docs_example())
    run = tmp_path / "run"
    proc = run_cli(
        [
            *SHORT_RUN,
            "logger=none",
            f"output_dir={run}",
            "+callbacks.best._target_=mypkg.best.BestEval",
            "trusted_targets=[evolm.*,mypkg.*]",
        ],
        env={"PYTHONPATH": f"{tmp_path}:{REPO}"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    evals = [r for r in read_results(run) if "eval/reward_mean" in r]
    best = max(evals, key=lambda r: r["eval/reward_mean"])
    generation, reward, fitness = (run / "best.txt").read_text().split(maxsplit=2)
    first_best = min(
        r["generation"] for r in evals if r["eval/reward_mean"] == best["eval/reward_mean"]
    )
    assert (int(generation), float(reward)) == (first_best, best["eval/reward_mean"])
    assert fitness.strip() == "start" if first_best == 0 else fitness.startswith("fitness ")


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_moved_target_names_its_new_path(old: str, tmp_path: Path) -> None:
    """A config (here the command line) naming a callback's old path is refused before
    anything is built, with the path to write instead; the new path is a callback."""
    new = MOVED[old]
    assert issubclass(get_class(new), Callback)
    cfg = compose_config([f"output_dir={tmp_path}", f"+callbacks.old._target_={old}"])
    with pytest.raises(ConfigError, match=re.escape(f"moved to '{new}'")) as raised:
        train(cfg)
    assert "callbacks.old._target_" in str(raised.value)


def test_a_resumed_config_with_an_old_target_is_read_with_the_new_path(tmp_path: Path) -> None:
    """A run directory written before the move: its config.yaml names the old paths, which the
    resume reads as the new ones (a pure rename: the same classes; a resume accepts no
    command-line override that could fix it)."""
    cfg = OmegaConf.to_container(compose_config([f"output_dir={tmp_path}"]), resolve=True)
    cfg["callbacks"]["progress"]["_target_"] = "evolm.tracking.callbacks.ProgressBar"
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    resumed = resumed_config(compose_config([f"resume={tmp_path}"]))
    assert resumed.callbacks.progress._target_ == "evolm.callbacks.progress.ProgressBar"


class SavesRecorded(MeanWriter):
    """A :class:`MeanWriter` whose saves are recorded, not written: (directory, generation of
    the state saved, the extra files)."""

    def __init__(self, best: str | None) -> None:
        super().__init__("adapter", best)
        self.saved: list[tuple[str, int, dict[str, str]]] = []

    def save(self, path: Path, ctx: RunContext, state: ESState, extra: Mapping[str, str]) -> None:
        self.saved.append((path.name, state.generation, dict(extra)))


def replay(
    writer: MeanWriter,
    evals: Sequence[float | None],
    history: list[Record],
    run_dir: Path = Path("run"),
) -> None:
    """A run of ``len(evals)`` records (``None``: a generation without an evaluation)."""
    ctx = RunContext(run_dir, len(evals), None, "base", history=history)  # type: ignore[arg-type]
    state = ESState(mean=[torch.zeros(1)], seed=0, generation=len(history))
    writer.on_run_start(ctx, state)
    for value in evals:
        ev = {} if value is None else {"eval/reward_mean": value, "time/eval_s": 1.0}
        writer.on_generation_end(ctx, GenerationRecord(state.generation, eval=ev), state)
        state.generation += 1
    writer.on_run_end(ctx, {}, state)


def test_keep_best_keeps_the_first_highest_eval_and_a_resume_goes_on_from_its_records() -> None:
    """``keep_best``: a save at each eval that beats every earlier one (not at a tie, a lower
    value, a NaN or a generation without an eval), ``best.json`` naming it; the final mean at
    the end whatever it scored. A resume starts from the best in its records."""
    writer = SavesRecorded("eval/reward_mean")
    replay(writer, [0.1, None, 0.5, 0.5, 0.3, math.nan], [])
    assert [(d, g) for d, g, _ in writer.saved] == [
        ("adapter-best", 0),
        ("adapter-best", 2),
        ("adapter", 6),
    ]
    note = json.loads(writer.saved[1][2][BEST_FILE])
    assert note == {"generation": 2, "metric": "eval/reward_mean", "value": 0.5}
    assert writer.saved[2][2] == {}  # the final adapter has no best.json
    resumed = SavesRecorded("eval/reward_mean")
    history = [
        {"generation": 0, "eval/reward_mean": 0.1},
        {"generation": 2, "eval/reward_mean": 0.5},
    ]
    replay(resumed, [0.4, 0.6], history)
    assert [(d, g) for d, g, _ in resumed.saved] == [("adapter-best", 3), ("adapter", 4)]
    off = SavesRecorded(None)
    replay(off, [0.1, 0.5], [])
    assert [d for d, _, _ in off.saved] == ["adapter"]


@pytest.mark.parametrize(
    ("evals", "history", "said"),
    [
        ([0.169, None, 0.1515], [], "0.1515 at generation 2, is below this run's best, 0.169 at "
         "generation 0 (the start: no generation of ES beat it)"),
        ([0.1, 0.5, 0.5], [], None),  # the last is the best: nothing to say
        ([0.1, 0.5, math.nan], [], None),  # a NaN last eval is not "below"
        ([0.4], [{"generation": 0, "eval/reward_mean": 0.1},
                 {"generation": 1, "eval/reward_mean": 0.5}],
         "0.4 at generation 2, is below this run's best, 0.5 at generation 1:"),  # resumed
    ],
)  # fmt: skip
def test_a_run_whose_last_eval_is_below_its_best_says_so_at_the_end(
    caplog: pytest.LogCaptureFixture,
    evals: list[float | None],
    history: list[Record],
    said: str | None,
) -> None:
    """``keep_best``: the final mean is the last one; when its evaluation is below the run's
    best (its records' too, on a resume), the run ends with a warning naming both and where the
    best mean is kept."""
    writer = SavesRecorded("eval/reward_mean")
    with caplog.at_level(logging.WARNING):
        replay(writer, evals, history)
    ended = [r.getMessage() for r in caplog.records if "is not the best one" in r.getMessage()]
    if said is None:
        assert ended == []
    else:
        assert len(ended) == 1 and said in ended[0]
        assert ended[0].endswith("kept in run/adapter-best")


@pytest.mark.parametrize(("generation", "value", "stale"), [(2, 0.5, False), (3, 0.9, True)])
def test_a_kept_mean_the_resumed_records_lack_is_removed_and_kept_anew(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, generation: int, value: float, stale: bool
) -> None:
    """A resume on new data from a checkpoint at generation 2, after the run had kept generation
    3's mean: that mean is not this trajectory's, so it goes, and the next evaluation keeps
    its own (0.4, below the records' 0.5). One the records hold stays."""
    kept = tmp_path / "adapter-best"
    kept.mkdir()
    note = {"generation": generation, "metric": "eval/reward_mean", "value": value}
    (kept / BEST_FILE).write_text(json.dumps(note))
    history = [
        {"generation": 0, "eval/reward_mean": 0.1},
        {"generation": 2, "eval/reward_mean": 0.5},
    ]
    writer = SavesRecorded("eval/reward_mean")
    with caplog.at_level(logging.WARNING):
        replay(writer, [0.4], history, tmp_path)
    assert kept.exists() is not stale
    saves = [(d, g) for d, g, _ in writer.saved]
    assert saves == ([("adapter-best", 2)] if stale else []) + [("adapter", 3)]
    assert any("not among the records" in r.getMessage() for r in caplog.records) is stale


def test_keep_best_of_a_metric_the_evals_lack_warns_once_and_keeps_nothing(caplog) -> None:
    writer = SavesRecorded("eval/accuracy_mean")  # a conciseness run has no accuracy
    with caplog.at_level(logging.WARNING):
        replay(writer, [0.1, 0.5, 0.7], [])
    assert [d for d, _, _ in writer.saved] == ["adapter"]
    warnings = [r.getMessage() for r in caplog.records if "keep_best" in r.getMessage()]
    assert len(warnings) == 1 and "eval/reward_mean" in warnings[0]  # it names what there is


def test_samples_keep_the_engines_token_ids_when_asked(tmp_path: Path) -> None:
    """``callbacks.samples.token_ids=true``: each line carries the completion's generated ids
    (the local engine's :class:`Completion`); off by default, and a plain ``str`` has none."""
    from evolm.callbacks.base import Sample
    from evolm.callbacks.samples import SampleWriter
    from evolm.engine.base import Completion

    rows = [
        Sample("p0", Completion(" 1 + 2", token_ids=[16, 488, 220]), {"reward": 1.0}),
        Sample("p1", " 3", {"reward": 0.0}),  # an engine that says no ids
        Sample("p2", Completion(" 4", token_ids=[19]), {"reward": 0.5}, eval_set="held"),
    ]
    for flag in (True, False):
        SampleWriter(count=4, token_ids=flag).write(tmp_path / str(flag), 7, 100, rows)
    read = {
        flag: [
            json.loads(line)
            for f in ("samples/gen-007.jsonl", "samples/held/gen-007.jsonl")
            for line in (tmp_path / str(flag) / f).read_text().splitlines()
        ]
        for flag in (True, False)
    }
    assert [r.get("token_ids") for r in read[True]] == [[16, 488, 220], None, [19]]
    assert all("token_ids" not in r for r in read[False])
    assert [r["completion"] for r in read[True]] == [" 1 + 2", " 3", " 4"]
