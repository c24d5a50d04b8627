"""The accuracy gates compare an engine's score file from a folder of the harness's, never in place: the
engine's folder is the PR's to shape, links included."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from evalbot.evaluate.context import SideFailed
from evalbot.evaluate.reference import _kept_scores
from evalbot.model import Side


def test_the_scores_are_copied_out_and_the_sidecar_cannot_be_steered_into_mains_folder(tmp_path: Path):
    """The attack (found by review, 2026-12-07): the PR's engine leaves `head-score.npy.json` as a relative
    link to main's score file; the harness wrote its sidecar through it and overwrote main's scores."""
    serve = tmp_path / "serve"
    (serve / "base" / "work").mkdir(parents=True)
    (serve / "head" / "work").mkdir(parents=True)
    mains = serve / "base" / "work" / "base-score.npy"
    mains.write_bytes(b"main's scores")
    made = serve / "head" / "work" / "head-score.npy"
    made.write_bytes(b"the PR's scores")
    os.symlink("../../base/work/base-score.npy", f"{made}.json")
    kept = _kept_scores(made, tmp_path / "accuracy" / "head-score.npy", Side.HEAD)
    Path(f"{kept}.json").write_text('{"token_ids": [1, 2]}')  # as the harness writes it
    assert kept.read_bytes() == b"the PR's scores" and kept.parent == tmp_path / "accuracy"
    assert mains.read_bytes() == b"main's scores"


@pytest.mark.parametrize("shape", ["link", "fifo", "folder"])
def test_a_score_file_that_is_not_a_regular_file_fails_its_side(tmp_path: Path, shape: str):
    made = tmp_path / "head-score.npy"
    target = tmp_path / "elsewhere.npy"
    target.write_bytes(b"x")
    {"link": lambda: os.symlink(target, made), "fifo": lambda: os.mkfifo(made), "folder": made.mkdir}[shape]()
    with pytest.raises(SideFailed) as err:
        _kept_scores(made, tmp_path / "accuracy" / "head-score.npy", Side.HEAD)
    assert err.value.failure.side is Side.HEAD and err.value.failure.stage == "accuracy"
