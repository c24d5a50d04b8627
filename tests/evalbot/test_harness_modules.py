"""The harness as a set of modules: a PR cannot shadow one by a path nobody listed, nor put other bytes in
its place through packaging (checked on the built venv)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from evalbot.evaluate import harness
from evalbot.evaluate.checkout import BuildError
from evalbot.policy.sensitive_paths import harness_hits, shadows
from evalbot.rules import default_rules_dir, load_rules

RULES = load_rules(default_rules_dir())


@pytest.mark.parametrize(
    "path",
    [
        "engine/cli.py",
        "engine/cli/__init__.py",  # a package wins over cli.py at import
        "engine/cli/anything.py",
        "engine/cli.cpython-311-x86_64-linux-gnu.so",  # an extension module wins over cli.py
        "engine/cli.abi3.so",
        "engine/cli.pyc",
        "engine/__pycache__/cli.cpython-311.pyc",
        "engine/__init__.py",
        "engine/__init__.cpython-311-x86_64-linux-gnu.so",
        "engine/__main__.py",
        "engine/protocol/__init__.py",
        "engine/prompts.py",
        "engine/serve/__init__.py",
    ],
)
def test_a_file_python_would_import_as_a_harness_module_is_sensitive(path):
    assert harness_hits([path], RULES) == (path,)


@pytest.mark.parametrize(
    "path",
    [
        "engine/model.py",
        "engine/client.py",
        "kernels/cli.py",
        "engine/ops.py",
        "engine/cli_helpers.py",
        "docs/engine/cli.md",
    ],
)
def test_ordinary_engine_files_are_not(path):
    assert harness_hits([path], RULES) == ()


def test_shadows_is_exact_about_folders():
    assert shadows("engine/__pycache__/cli.cpython-311.pyc", "engine.cli")
    assert not shadows("engine/sub/__pycache__/cli.cpython-311.pyc", "engine.cli")
    assert not shadows("engine/clix.py", "engine.cli")


def _venv(root: Path, files: dict[str, str]) -> Path:
    """A real venv with files under its site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next(root.glob("lib/python3*/site-packages"))
    for name, text in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    return root


def test_the_built_harness_is_compared_byte_for_byte(tmp_path):
    modules = ("engine.__init__", "engine.cli", "engine.protocol")
    main = {
        "engine/__init__.py": "",
        "engine/cli.py": "print('bench')\n",
        "engine/protocol.py": "SCHEMA = 1\n",
    }
    base = harness.harness_fingerprint(_venv(tmp_path / "base", main), modules, sys.executable)
    assert (
        base["modules"]["engine.cli"]["file"] == "engine/cli.py" and base["modules"]["engine.cli"]["sha256"]
    )
    same = harness.harness_fingerprint(_venv(tmp_path / "same", main), modules, sys.executable)
    assert harness.harness_drift(base, same) == []
    rigged = harness.harness_fingerprint(
        _venv(tmp_path / "rigged", {**main, "engine/cli.py": "print('3x')\n"}), modules, sys.executable
    )
    assert any("engine.cli" in d for d in harness.harness_drift(base, rigged))
    package = harness.harness_fingerprint(
        _venv(tmp_path / "pkg", {**main, "engine/cli/__init__.py": "x = 1\n"}), modules, sys.executable
    )
    assert any("engine/cli/__init__.py" in d for d in harness.harness_drift(base, package))
    pth = harness.harness_fingerprint(
        _venv(tmp_path / "pth", {**main, "boot.pth": "import os\n"}), modules, sys.executable
    )
    assert harness.harness_drift(base, pth) == ["start-up file boot.pth is new"]
    custom = harness.harness_fingerprint(
        _venv(tmp_path / "custom", {**main, "sitecustomize.py": "x = 1\n"}), modules, sys.executable
    )
    assert "start-up file sitecustomize.py is new" in harness.harness_drift(base, custom)


def test_the_probe_never_runs_the_venvs_own_interpreter(tmp_path):
    """The PR's build may replace its venv's bin/python with a program that behaves like Python and
    leaves something behind on the host. The probe is asked of the trusted interpreter, so that program
    never runs, and the venv's files read the same."""
    modules = ("engine.__init__", "engine.cli")
    main = {"engine/__init__.py": "", "engine/cli.py": "print('bench')\n"}
    base = harness.harness_fingerprint(_venv(tmp_path / "base", main), modules, sys.executable)
    head = _venv(tmp_path / "head", main)
    ran = tmp_path / "launcher-ran"
    launcher = head / "bin" / "python"
    launcher.unlink()
    launcher.write_text(f'#!/bin/sh\ntouch {ran}\nexec {sys.executable} "$@"\n')
    launcher.chmod(0o755)
    got = harness.harness_fingerprint(head, modules, sys.executable)
    assert harness.harness_drift(base, got) == []
    assert not ran.exists(), "the head venv's bin/python ran on the host"


def test_a_venv_of_another_python_is_a_clear_error(tmp_path):
    venv = _venv(tmp_path / "v", {"engine/__init__.py": ""})
    cfg = venv / "pyvenv.cfg"
    cfg.write_text(
        cfg.read_text().replace(f"version = {sys.version_info[0]}.{sys.version_info[1]}", "version = 2.7")
    )
    with pytest.raises(BuildError, match=re.escape("the venv is Python 2.7")):
        harness.harness_fingerprint(venv, ("engine.__init__",), sys.executable)
