"""A run whose output goes to a file says where it is, how the model build goes and how every
generation went (issue 24 item 6: before, it printed nothing for minutes and named its run
directory only on its last line)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO


def test_run_logged_to_a_file_reports_its_directory_build_and_generations(tmp_path: Path) -> None:
    """``python -m evolm ... > log 2>&1`` (not a terminal) with a model to build: the first evolm
    line names the run directory, the build logs every 10% of its warm-up steps, and each
    generation logs one line with its fitness, the mean's training reward (train_mean=true),
    eval reward and seconds."""
    run, log = tmp_path / "run", tmp_path / "log"
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}  # tqdm decides alone
    env |= {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "EVOLM_CACHE_DIR": str(tmp_path)}
    args = ["debug=fast", "logger=none", "model.warmup_steps=20", f"hydra.run.dir={run}"]
    with open(log, "w") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "evolm", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env=env,
            timeout=300,
        )
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    lines = [line for line in text.splitlines() if "][evolm" in line]
    assert lines[0].endswith(f"run directory: {run}"), lines[:3]
    assert any("building the tiny model" in line for line in lines)
    every_10 = r"tiny model warm-up: step (\d+)/20, loss [\d.]+, \d+ s so far, about \d+ s left"
    steps = [int(m.group(1)) for m in re.finditer(every_10, text)]
    assert steps == [2, 4, 6, 8, 10, 12, 14, 16, 18]  # each with the time left (issue 40 item 6)
    generations = re.findall(r"generation (\d)/3: (.*)", text)
    assert [int(g) for g, _ in generations] == [0, 1, 2, 3]
    assert re.fullmatch(r"eval reward [-\d.e]+, [\d.]+ s", generations[0][1])
    every = (
        r"fitness [-\d.e]+ \(std [-\d.e]+\), mean [-\d.e]+, eval reward [-\d.e]+, [\d.]+ s"
        r" \(engine tail [\d.]+ s\)"  # issue 37: the steps that serve a few long rows
    )
    assert all(re.fullmatch(every, rest) for _, rest in generations[1:]), generations
