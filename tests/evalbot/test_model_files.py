"""A model file on the runner (models.yaml `{name, file, sha256}`, #38 part 3): read whole and checked
against its pinned digest before anything is built; a .sha256 file beside it is never believed."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from evalbot.evaluate.context import SideFailed
from evalbot.evaluate.reference import fetch_models
from evalbot.model import RunOptions, Side
from evalbot.rules import ModelRef


def _ctx(logs: list[str]):
    pair = SimpleNamespace(
        target=ModelRef("t", "registry", "0" * 64), draft=ModelRef("d", "registry", "0" * 64)
    )
    return SimpleNamespace(req=SimpleNamespace(options=RunOptions(spec=False)),
                           ws=SimpleNamespace(rules=SimpleNamespace(spec_pair=pair)), log=logs.append)  # fmt: skip


def _profile(path: Path, sha: str):
    return SimpleNamespace(models=(ModelRef("qwen-7b", "file", sha, str(path)),))


def test_a_pinned_file_is_used_where_it_lies(tmp_path):
    model = tmp_path / "qwen.gguf"
    model.write_bytes(b"GGUF" + bytes(1000))
    logs: list[str] = []
    got = fetch_models(_ctx(logs), _profile(model, hashlib.sha256(model.read_bytes()).hexdigest()))
    assert got == {"qwen-7b": model} and any("checking qwen-7b" in line for line in logs)


def test_a_file_whose_digest_differs_stops_the_evaluation_as_the_boxs_fault(tmp_path):
    model = tmp_path / "qwen.gguf"
    model.write_bytes(b"GGUF" + bytes(1000))
    # a .sha256 beside it that says what the rules want: not believed
    pinned = "ab" * 32
    (tmp_path / "qwen.gguf.sha256").write_text(f"qwen.gguf {pinned}\n")
    with pytest.raises(SideFailed) as info:
        fetch_models(_ctx([]), _profile(model, pinned))
    f = info.value.failure
    assert f.side is Side.HARNESS and f.stage == "models"
    assert hashlib.sha256(model.read_bytes()).hexdigest() in f.message and pinned in f.message


def test_a_file_the_runner_lacks_is_named(tmp_path):
    with pytest.raises(SideFailed) as info:
        fetch_models(_ctx([]), _profile(tmp_path / "gone.gguf", "ab" * 32))
    assert "which this runner lacks" in info.value.failure.message
