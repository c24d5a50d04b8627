"""The Makefile's habits, read from `make -n` on a venv that does not exist yet (a fresh clone): what each
target would run, in order, without running it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def dry_run(target: str, tmp_path: Path) -> str:
    """The commands `make TARGET` would run from a fresh clone (its venv not made yet)."""
    proc = subprocess.run(["make", "-n", "--no-print-directory", target, f"VENV={tmp_path / 'venv'}"],
                          cwd=ROOT, capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    return proc.stdout


@pytest.mark.parametrize("target", ["lint", "check"])
def test_lint_and_check_install_the_dev_tools_and_never_build_llama_cpp_nor_fetch_a_model(tmp_path, target):
    out = dry_run(target, tmp_path)
    assert "install -e ./engine-dist -e '.[bot,dev]'" in out and "ruff check" in out and "lint-imports" in out
    assert "evalbot.reference.build" not in out and "evalbot.reference.registry fetch" not in out


def test_check_runs_the_unit_tests_on_every_core_and_says_what_it_leaves_out(tmp_path):
    out = dry_run("check", tmp_path)
    assert out.index("ruff check") < out.index("-m pytest")  # lint first
    assert "-n " in out and "--dist loadscope" in out
    assert '-m "not timing and not slow and not reference and not e2e"' in out
    assert "left to make test: the tests marked timing, slow, reference and e2e" in out


def test_make_test_builds_the_reference_and_fetches_the_models_before_lint_and_the_tests(tmp_path):
    out = dry_run("test", tmp_path)
    build, fetch = out.index("evalbot.reference.build install"), out.index("evalbot.reference.registry fetch")
    assert build < fetch < out.index("ruff check") < out.index('-m "not timing"')
