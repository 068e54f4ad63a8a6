"""Helpers shared by tests: compose the real config, run the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import evolm.config  # noqa: F401  (registers the schemas)
from evolm.callbacks import GenerationRecord
from evolm.es import TellStats

REPO = Path(__file__).resolve().parents[1]
CONF = str(REPO / "conf")


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    with initialize_config_dir(config_dir=CONF):
        return compose("config", overrides=list(overrides))


def run_cli(
    args: Sequence[str], timeout: float = 300, cwd: Path = REPO, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m evolm ARGS`` in a subprocess (offline, tqdm off)."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "evolm", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=full_env,
    )


def read_results(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]


def gloo_env(rank: int, world: int, port: int) -> dict[str, str]:
    """The launch variables of rank ``rank`` of ``world`` on 127.0.0.1, gloo backend (CPU)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "EVOLM_DIST_BACKEND": "gloo",
    }


def env_without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """``run_cli`` env in which ``modules`` cannot be imported (what an install without them
    sees): a ``sitecustomize`` on ``PYTHONPATH`` sets ``sys.modules[name] = None``."""
    hide = tmp_path / "hide"
    hide.mkdir(exist_ok=True)
    lines = ["import sys", *(f"sys.modules[{m!r}] = None" for m in modules)]
    (hide / "sitecustomize.py").write_text("\n".join(lines) + "\n")
    return {"PYTHONPATH": f"{hide}:{REPO}"}


def generation_record(
    generation: int,
    fitness_mean: float = 0.0,
    fitness_std: float = 0.0,
    update_norm: float = 0.1,
    diagnostics: dict[str, float] | None = None,
    nonfinite: int = 0,
) -> GenerationRecord:
    """The typed record a callback gets after a generation (fitness summaries all
    ``fitness_mean``: a callback reads the mean and std), as :class:`evolm.loop.ESLoop` emits."""
    es = TellStats(
        fitness_mean=fitness_mean,
        fitness_std=fitness_std,
        fitness_min=fitness_mean,
        fitness_max=fitness_mean,
        fitness_p20=fitness_mean,
        fitness_p80=fitness_mean,
        fitness_nonfinite=nonfinite,
        update_norm=update_norm,
        mean_norm=1.0,
    )
    return GenerationRecord(generation, es, diagnostics=diagnostics or {})


def check_stop_strings(
    engine: Any, population: Any, prompts: Sequence[str], reference: Any = None
) -> None:
    """``engine`` with stop strings returns its own plain completions cut after the first stop
    string (``cut_at_stop``), ``stopped`` where cut, some rows stopped and some not (stop
    strings from the second words of the plain completions); and, given a ``reference`` engine
    that computes the same numbers (the SGLang stand-in's LocalEngine), exactly its texts."""
    from evolm.sampling import Sampling, cut_at_stop

    plain = engine.generate(prompts, population, Sampling(16), 0)
    flat = [str(t) for m in plain for t in m]
    words = sorted({t.split()[1] for t in flat if len(t.split()) > 2})
    stop = tuple(w for w in words if sum(w in t for t in flat) < len(flat))[:2]
    assert stop, f"no stop string held by some completions only: {flat}"
    sampling = Sampling(16, stop=stop)
    got = engine.generate(prompts, population, sampling, 0)
    cut = [[cut_at_stop(str(t), stop) for t in m] for m in plain]
    assert [[str(t) for t in m] for m in got] == [[text for text, _ in m] for m in cut]
    flags = [[t.stopped for t in m] for m in got]
    assert flags == [[hit for _, hit in m] for m in cut] and any(map(any, flags))
    if reference is not None:
        want = reference.generate(prompts, population, sampling, 0)
        assert [[str(t) for t in m] for m in got] == [[str(t) for t in m] for m in want]
