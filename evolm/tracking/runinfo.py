"""What identifies a run outside its metrics: its config as flat params, the code's commit."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import evolm

MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"es": {"sigma": 0.05}}`` -> ``{"es.sigma": "0.05"}`` (lists as their repr)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, list | tuple):
            out[name] = str(list(value))[:MAX_PARAM_CHARS]
        else:
            out[name] = str(value)[:MAX_PARAM_CHARS]
    return out


def git_commit() -> str | None:
    """The commit of the git checkout evolm is imported from (None if it is not in one)."""
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(evolm.__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None
