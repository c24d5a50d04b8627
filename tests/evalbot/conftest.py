"""Fixtures the rules tests share."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from evalbot.rules import default_rules_dir


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    """A private copy of the shipped rules, to break one thing at a time."""
    return Path(shutil.copytree(default_rules_dir(), tmp_path / "rules"))
