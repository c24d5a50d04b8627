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


@pytest.mark.skipif(
    not __import__("evalbot.evaluate.sandbox", fromlist=["x"]).sandbox_available(),
    reason="bubblewrap cannot create namespaces here",
)
def test_the_sandbox_sees_a_runner_file_but_not_its_folder(tmp_path):
    """A model named by its path on the runner may lie in a folder with anything beside it (a home directory
    with the runner's signing key): the engines read the file, never its neighbours."""
    from evalbot.evaluate import sandbox
    from evalbot.evaluate.context import ro_binds
    from evalbot.evaluate.reference import model_binds

    home = tmp_path / "home"
    home.mkdir()
    (home / "model.gguf").write_bytes(b"GGUF weights")
    (home / "runner-key.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "fetched.gguf").write_bytes(b"GGUF fetched")
    binds = model_binds({"local": home / "model.gguf", "fetched": cache / "fetched.gguf"}, {"local"})
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    spec = sandbox.SandboxSpec(ro_binds=tuple(ro_binds(binds)), scratch=scratch, workdir=scratch,
                               env={"PATH": "/usr/bin:/bin"}, limits=sandbox.Limits(timeout_s=30))  # fmt: skip
    assert sandbox.run(spec, ["cat", str(home / "model.gguf")]).stdout == "GGUF weights"
    assert sandbox.run(spec, ["cat", str(cache / "fetched.gguf")]).stdout == "GGUF fetched"
    stolen = sandbox.run(spec, ["cat", str(home / "runner-key.pem")])
    assert stolen.returncode != 0 and "PRIVATE" not in stolen.stdout
