"""scripts/dead_code.py, `make lint`'s dead-code check: clean on the repository, and failing on a copy of the
product's packages given a public function or a module that nothing in them uses."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vulture")  # the dev extra's
pytest.importorskip("grimp")

ROOT = Path(__file__).resolve().parents[1]


def run(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(root / "scripts" / "dead_code.py")], capture_output=True, text=True, timeout=300
    )


def test_the_repository_has_no_dead_code():
    result = run(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_function_or_a_module_nothing_uses_fails_the_check(tmp_path):
    for name in ("evalbot", "engine", "kernels", "scripts"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    stats = tmp_path / "evalbot" / "stats.py"
    line = len(stats.read_text(encoding="utf-8").splitlines()) + 3  # after two blank lines
    helper = (
        'def relative_gain(est: PairedEstimate) -> float:\n    """Nothing calls this."""\n    return 0.0\n'
    )
    stats.write_text(stats.read_text(encoding="utf-8") + "\n\n" + helper, encoding="utf-8")
    (tmp_path / "evalbot" / "orphan.py").write_text('"""Nothing imports this."""\n')
    result = run(tmp_path)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"evalbot/stats.py:{line}: unused function 'relative_gain' (60% confidence)",
        "evalbot.orphan: no import chain from an entry point reaches this module",
    ]
