"""What the docs tell a user to run exists in a user's checkout and matches the project."""

from __future__ import annotations

import re
import tomllib

from tests.helpers import REPO

USER_DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_docs_name_no_path_outside_the_checkout() -> None:
    """The team's ``../shared/`` folder (data, tools, notes) is not part of a user's checkout
    (before: docs/tasks.md ran ``task.data_file=../shared/data/countdown/countdown.json``)."""
    found = [
        f"{p.relative_to(REPO)}:{n}"
        for p in [*USER_DOCS, *sorted((REPO / "conf").rglob("*.yaml"))]
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"(^|[\s`(/])shared/(docs|data|tools)", line)
    ]
    assert not found, found


def test_sglang_extra_pins_the_measured_version() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    [pin] = extras["sglang"]
    version = pin.removeprefix("sglang==")
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), pin
    assert f"SGLang {version}" in (REPO / "docs" / "sglang-gpu.md").read_text()


def test_vllm_setup_time_is_the_measured_one() -> None:
    """Measured: launchers/setup_vllm_cpu.sh took 6 minutes and 3.4 GB (docs said 2 minutes)."""
    text = " ".join((REPO / "docs" / "servers.md").read_text().split())
    assert "about 6 minutes and 3.4 GB" in text and "about 2 minutes" not in text


def test_the_architecture_map_names_only_paths_that_exist() -> None:
    """docs/architecture.md is the map of the folders: every ``evolm/...`` path it names is there
    (a module or folder moved without its map is caught here)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"\bevolm/[\w/]*\w(?:\.py)?/?", text))
    assert named, "the map names no path"
    missing = sorted(p for p in named if not (REPO / p).exists())
    assert not missing, missing
