"""The import contracts in pyproject.toml hold on the tree, and each one breaks on a deliberate violation.

`make test` runs lint-imports on the real tree; here a copy of the packages gets one bad import at a
time, and lint-imports must name the contract it breaks (a contract that never fails checks nothing).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (make setup-tools)")


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("contracts")
    for pkg in ("evalbot", "engine", "kernels"):
        shutil.copytree(
            ROOT / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__", "data", "templates")
        )
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}  # the copy, not the installed tree
    return subprocess.run([str(LINT), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_the_tree_keeps_every_contract(tree: Path):
    got = lint(tree)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-2000:]
    assert "0 broken" in got.stdout


VIOLATIONS = [
    ("evalbot/poller/__init__.py", "import github", "PyGithub only in evalbot.github"),
    ("evalbot/github/facts.py", "import github", "PyGithub only in evalbot.github"),  # only its adapter
    ("evalbot/github/artifacts.py", "import github", "PyGithub only in evalbot.github"),
    ("evalbot/store/db.py", "import yaml", "yaml only in evalbot.rules"),
    ("evalbot/rules/schema.py", "import yaml", "yaml only in evalbot.rules"),  # only its reader and loader
    ("evalbot/rules/sections.py", "import yaml", "yaml only in evalbot.rules"),
    ("evalbot/times.py", "import sqlite3", "pure deciders import no I/O module and no renderer"),
    ("evalbot/copycat/index.py", "import sqlite3", "sqlite3 only in evalbot.store"),
    ("evalbot/dispatch/client.py", "import sqlite3", "sqlite3 only in evalbot.store"),
    ("evalbot/cli/bot_cmd.py", "import sqlite3", "sqlite3 only in evalbot.store"),
    ("evalbot/publish.py", "import jinja2", "jinja2 only in evalbot.render"),
    ("evalbot/rounds.py", "from evalbot import store", "pure deciders import no I/O module and no renderer"),
    (
        "evalbot/policy/cap.py",
        "from evalbot import render",
        "pure deciders import no I/O module and no renderer",
    ),
    ("evalbot/model/__init__.py", "from evalbot import verdict", "bot layers"),
    ("evalbot/codec.py", "from evalbot import verdict", "bot layers"),
    (
        "evalbot/verdict/decide.py",
        "from evalbot import store",
        "pure deciders import no I/O module and no renderer",
    ),
    (
        "evalbot/copycat/containment.py",
        "import sqlite3",
        "pure deciders import no I/O module and no renderer",
    ),
    ("evalbot/copycat/strikes.py", "from evalbot import verdict", "bot layers"),  # verdict sits above copycat
    ("evalbot/rounds.py", "from evalbot import copycat", "bot layers"),  # siblings
    ("evalbot/evaluate/box.py", "from evalbot import publish", "bot layers"),
    ("evalbot/stats.py", "import torch", "evalbot talks to the engine only through its CLI"),
]


@pytest.mark.parametrize(
    ("path", "line", "contract"), VIOLATIONS, ids=[v[1] + " in " + v[0] for v in VIOLATIONS]
)
def test_a_deliberate_violation_breaks_its_contract(tree: Path, path: str, line: str, contract: str):
    target = tree / path
    original = target.read_text()
    target.write_text(original + f"\n{line}  # noqa\n")
    try:
        got = lint(tree)
    finally:
        target.write_text(original)
    assert got.returncode != 0, f"{line!r} in {path} broke nothing"
    broken = got.stdout[got.stdout.index("Broken contracts") :] if "Broken contracts" in got.stdout else ""
    assert contract in " ".join(broken.split()), got.stdout[-3000:]
