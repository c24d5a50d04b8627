"""Pytest fixtures for the GitHub double; load them with ``pytest_plugins = ["tests.github_double.fixture"]``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.github_double.serve import Double, FakeClock, serve


@pytest.fixture
def github_double() -> Iterator[Double]:
    """A running GitHub double with an empty repository "contest/engine"."""
    with serve() as double:
        yield double


@pytest.fixture
def fake_clock() -> FakeClock:
    """An instant clock/sleep pair starting at the double's clock."""
    return FakeClock()
