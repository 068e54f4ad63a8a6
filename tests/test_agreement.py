"""Ranks of one distributed run that composed different runs or read different data stop, every
one of them, with one message naming the ranks, before any model loads (issue 31, items 6 and
19). Before: ranks given different ``task.train_file`` s of one length each trained on their own
prompts and the run finished with exit 0; of different lengths, rank 1 crashed mid-run with
``ValueError: attempt to assign sequence of size 4 to extended slice of size 10``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evolm.preflight.agreement import data_fingerprint
from evolm.server.connection import free_port
from evolm.task.conciseness import Conciseness
from tests.helpers import REPO


def env() -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TQDM_DISABLE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
    }


def write_data(path: Path, answers: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"question": f"What is {a}?", "answer": a}) for a in answers]
    path.write_text("\n".join(lines) + "\n")
    return path


RUN = ["debug=fast", "logger=none"]


@pytest.mark.slow  # make test-all (CI: nodes whose data files differ)
def test_ranks_with_other_train_files_stop_naming_the_key(
    tiny_model_dir: str, tmp_path: Path
) -> None:
    """``task.train_file`` read from each rank's environment: two files of 4 records each."""
    for rank, word in enumerate(("red", "blue")):
        write_data(tmp_path / f"train-{rank}.jsonl", [f"{word}{i}" for i in range(4)])
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"),
            *("--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "evolm"),
            *RUN,
            f"task.train_file={tmp_path}/train-${{oc.env:RANK}}.jsonl",
            f"hydra.run.dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env(),
        cwd=REPO,
    )
    out = proc.stdout + proc.stderr
    message = (
        f"bad configuration: task.train_file: ranks [1] composed another run than rank 0: "
        f"'{tmp_path}/train-0.jsonl' on rank 0, '{tmp_path}/train-1.jsonl' on rank 1. Fix: "
        "launch every rank with the same command line"
    )
    assert proc.returncode != 0 and out.count(message) == 2, out[-4000:]  # every rank
    assert "ES over" not in out  # before the model loads
    assert not run_dir.exists()  # nothing started


def test_nodes_whose_data_files_differ_stop_naming_the_ranks(
    tiny_model_dir: str, tmp_path: Path
) -> None:
    """Two "nodes" (torchrun agents in their own working directories, as on two hosts) with the
    same config ``task.train_file=data/train.jsonl``, whose files differ (4 and 10 records)."""
    port = free_port()
    agents = []
    for node, size in ((0, 4), (1, 10)):
        cwd = tmp_path / f"node{node}"
        write_data(cwd / "data" / "train.jsonl", [f"answer{i}" for i in range(size)])
        agents.append(
            subprocess.Popen(
                [
                    *(sys.executable, "-m", "torch.distributed.run", "--nnodes=2"),
                    *("--nproc_per_node=1", "--rdzv-backend=c10d", "--local-addr=127.0.0.1"),
                    *(f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=evolm-agree"),
                    *(f"--node-rank={node}", "-m", "evolm"),
                    *RUN,
                    "task.train_file=data/train.jsonl",
                    f"hydra.run.dir={tmp_path / 'run'}",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env(),
                cwd=cwd,
            )
        )
    outs = [a.communicate(timeout=180)[0] for a in agents]
    for agent, out in zip(agents, outs, strict=True):
        assert agent.returncode != 0, out[-3000:]
        assert "bad configuration: task: ranks [1] read other prompts than rank 0" in out, out[
            -3000:
        ]
        assert "give every node the same data files" in out and "ES over" not in out
        assert "extended slice" not in out


def test_data_fingerprint_sees_one_changed_answer(tmp_path: Path) -> None:
    answers = [f"a{i}" for i in range(6)]
    one = Conciseness(train_file=str(write_data(tmp_path / "one.jsonl", answers)))
    same = Conciseness(train_file=str(write_data(tmp_path / "same.jsonl", answers)))
    changed = Conciseness(
        train_file=str(write_data(tmp_path / "changed.jsonl", [*answers[:-1], "a55"]))
    )
    assert data_fingerprint(one, 3) == data_fingerprint(same, 3)
    assert data_fingerprint(one, 3) != data_fingerprint(changed, 3)


class TwoRanks:
    """Rank 0 of two, whose rank 1 sends ``other`` (what ``comm.gather`` gives rank 0)."""

    world_size = 2

    def __init__(self, other: object) -> None:
        self.other = other

    def gather(self, mine: object) -> list[object]:
        return [mine, self.other]


def test_ranks_whose_extra_eval_differs_stop_naming_it(tmp_path: Path) -> None:
    """Issue 40 item 4: an extra eval's config and data are compared across ranks as the task's
    are (before: a rank could score another extra eval, unnoticed)."""
    from evolm.checkpoint import run_identity
    from evolm.errors import ConfigError
    from evolm.preflight.agreement import check_ranks_agree, data_fingerprints

    task = Conciseness()
    extra = {"other": Conciseness(eval_file=str(write_data(tmp_path / "a.jsonl", ["red"])))}
    changed = {"other": Conciseness(eval_file=str(write_data(tmp_path / "b.jsonl", ["blue"])))}
    config = {"seed": 0, "extra_evals": {"other": {"max_new_tokens": 8, "url": "x"}}}
    agreed = run_identity(config) | run_identity(config, ("extra_evals",))
    data = data_fingerprints(task, 3, extra)
    assert set(data) == {"task", "extra_evals.other"}
    check_ranks_agree(TwoRanks((agreed, data)), agreed, data)  # type: ignore[arg-type]
    other_data = data_fingerprints(task, 3, changed)
    with pytest.raises(ConfigError) as raised:
        check_ranks_agree(TwoRanks((agreed, other_data)), agreed, data)  # type: ignore[arg-type]
    assert raised.value.key == "extra_evals.other"
    assert "ranks [1] read other prompts" in raised.value.problem
    other_config = {**agreed, "extra_evals.other.max_new_tokens": 16}
    with pytest.raises(ConfigError) as raised:
        check_ranks_agree(TwoRanks((other_config, data)), agreed, data)  # type: ignore[arg-type]
    assert raised.value.key == "extra_evals.other.max_new_tokens"
    assert "extra_evals.other.url" not in agreed  # where a service is, as task.url
