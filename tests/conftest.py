"""Shared fixtures: one tiny model per test session, built offline into a temp cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session", autouse=True)
def evolm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every model evolm builds in this session (and its subprocesses) goes here."""
    cache = Path(os.environ.get("EVOLM_TEST_CACHE") or tmp_path_factory.mktemp("evolm-cache"))
    os.environ["EVOLM_CACHE_DIR"] = str(cache)
    return cache


@pytest.fixture(scope="session")
def tiny_model_dir(evolm_cache: Path) -> str:
    from evolm.model import TinyModel

    return TinyModel().resolve()
