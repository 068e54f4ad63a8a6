"""A damaged model cache is rebuilt, an unwritable one named (issue 31, items 14-16).

Before: a truncated cached ``model.safetensors`` (a disk that filled during a build, a killed
copy) crashed the run with ``SafetensorError``, a cached model folder without its weights with
``OSError``, and a read-only cache with no model built yet with a bare ``OSError``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from evolm.errors import ConfigError
from evolm.files import file_lock
from evolm.model import TinyModel, load_causal_lm
from evolm.model import cache as model_cache
from evolm.model.cache import build_atomically, build_lock, is_built, model_problem
from tests.helpers import NoLocks

QUICK = {"warmup_steps": 3}  # builds that test mechanics, not the warmed-up model


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache holding one quick tiny model (copied by each test before it damages it)."""
    cache = tmp_path_factory.mktemp("cache")
    TinyModel(cache_dir=str(cache), **QUICK).resolve()
    return cache


def damaged_copy(built: Path, tmp_path: Path) -> tuple[TinyModel, Path, bytes]:
    cache = tmp_path / "cache"
    shutil.copytree(built, cache)
    spec = TinyModel(cache_dir=str(cache), **QUICK)
    weights = spec.model_dir() / "model.safetensors"
    return spec, weights, weights.read_bytes()


@pytest.mark.parametrize("cut", [100, 0.5, -1])
def test_a_truncated_cached_model_is_found_unusable(
    built: Path, tmp_path: Path, cut: float
) -> None:
    """Cut in the header, in the middle, and by one byte: each cut copy is found unusable."""
    spec, weights, good = damaged_copy(built, tmp_path)
    size = int(cut) if cut >= 1 else int(len(good) * cut) if cut > 0 else len(good) - 1
    weights.write_bytes(good[:size])
    assert not is_built(spec.model_dir())
    problem = model_problem(spec.model_dir())
    assert problem is not None and problem.startswith("model.safetensors is unreadable"), problem


def test_a_truncated_cached_model_is_rebuilt(
    built: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cut copy (here by one byte) is rebuilt, to the same bytes (the build is
    deterministic), with a warning naming the folder and the problem."""
    spec, weights, good = damaged_copy(built, tmp_path)
    weights.write_bytes(good[:-1])
    assert spec.resolve() == str(spec.model_dir())
    assert weights.read_bytes() == good
    assert f"the cached model {spec.model_dir()} is unusable (model.safetensors is unreadable" in (
        caplog.text
    )
    load_causal_lm(spec.resolve(), device="cpu", dtype=torch.float32)
    assert sorted(p.name for p in spec.model_dir().parent.iterdir()) == [spec.model_dir().name]


def test_a_cached_model_without_its_weights_is_rebuilt(
    built: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec, weights, good = damaged_copy(built, tmp_path)
    weights.unlink()
    assert model_problem(spec.model_dir()) == "model.safetensors is missing"
    spec.resolve()
    assert weights.read_bytes() == good
    assert "(model.safetensors is missing): building it again" in caplog.text


RESOLVE = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from evolm.model import TinyModel
print(TinyModel(cache_dir=sys.argv[1], warmup_steps=3).resolve())
"""


@pytest.mark.timeout(180)  # the loop below reads the child's log until it waits
def test_a_second_builder_waits_for_the_first_and_loads_its_model(
    built: Path, tmp_path: Path
) -> None:
    """Two processes that ask for one model on an empty cache build it once: the second waits
    on the first's build lock, then loads what the first built (before: both built it, and one
    threw its copy away: the tests' background build and their first user did so)."""
    cache = tmp_path / "cache"
    spec = TinyModel(cache_dir=str(cache), **QUICK)
    target = spec.model_dir()
    with file_lock(build_lock(target)):  # this process is the first builder
        proc = subprocess.Popen(
            [sys.executable, "-c", RESOLVE, str(cache)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        said = []
        assert proc.stderr is not None
        for line in proc.stderr:  # until it waits (or, wrongly, ends without waiting)
            said.append(line)
            if "is building" in line:
                break
        assert proc.poll() is None, "".join(said)
        shutil.copytree(built / "models" / target.name, target)  # what the first one built
    out, err = proc.communicate(timeout=120)
    said.append(err)
    assert proc.returncode == 0, "".join(said)
    assert out.strip() == str(target)
    text = "".join(said)
    assert f"another process is building {target}: waiting for it" in text
    assert f"another process built {target}; using it" in text
    assert "tiny model warm-up:" not in text  # it built nothing
    assert sorted(p.name for p in cache.iterdir()) == ["locks", "models"]
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]


def test_a_cache_that_takes_no_locks_builds_without_one(
    built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A filesystem without ``flock`` (some network mounts: ENOLCK) builds as before the lock,
    and says so, instead of failing the run."""

    monkeypatch.setattr(model_cache, "file_lock", NoLocks)
    caplog.set_level(logging.INFO, logger=model_cache.__name__)
    source = next((built / "models").iterdir())
    target = tmp_path / "cache" / "models" / source.name
    build_atomically(target, lambda tmp: shutil.copytree(source, tmp, dirs_exist_ok=True))
    assert is_built(target)
    assert f"the model cache takes no locks (No locks available): building {target}" in caplog.text


def test_sharded_weights_are_checked_through_their_index(built: Path, tmp_path: Path) -> None:
    spec, weights, _ = damaged_copy(built, tmp_path)
    shard = weights.with_name("model-00001-of-00001.safetensors")
    weights.rename(shard)
    index = spec.model_dir() / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {"lm_head.weight": shard.name}}))
    assert model_problem(spec.model_dir()) is None
    shard.write_bytes(shard.read_bytes()[:-8])
    assert f"{shard.name} is unreadable" in str(model_problem(spec.model_dir()))


@pytest.fixture
def read_only_cache(tmp_path: Path) -> Iterator[Path]:
    """An empty cache folder this process cannot write: mode 0555, or for root (whom modes do
    not stop) the immutable attribute (``chattr +i``)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    if os.geteuid() != 0:
        cache.chmod(0o555)
        yield cache
        cache.chmod(0o755)
        return
    made = subprocess.run(["chattr", "+i", str(cache)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"running as root, and chattr +i fails here: {made.stderr.strip()}")
    try:
        yield cache
    finally:
        subprocess.run(["chattr", "-i", str(cache)], check=True)


def test_a_read_only_cache_names_the_key_and_the_variable(read_only_cache: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        TinyModel(cache_dir=str(read_only_cache), **QUICK).resolve()
    message = str(raised.value)
    assert message.startswith(
        f"cache_dir: cannot write the model cache {read_only_cache / 'models'} to build tiny-"
    ), message
    assert "Fix: point model.cache_dir (or $EVOLM_CACHE_DIR) at a folder you can write" in message
    assert list(read_only_cache.iterdir()) == []
