"""bench/decode_drift.py's Allan deviation: white noise falls with the window, a drift does not."""

from __future__ import annotations

import importlib.util
import math
import random
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "dd", Path(__file__).resolve().parents[1] / "bench" / "decode_drift.py"
)
dd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dd)


def test_white_noise_falls_as_one_over_root_w_and_a_random_walk_rises():
    rng = random.Random(1)
    white = [rng.gauss(0, 0.02) for _ in range(20000)]
    assert abs(dd.allan(white, 1) - 0.02) < 0.002
    assert abs(dd.allan(white, 16) - 0.02 / 4) < 0.001
    walk, level = [], 0.0
    for _ in range(20000):
        level += rng.gauss(0, 0.001)
        walk.append(level)
    assert dd.allan(walk, 64) > 3 * dd.allan(walk, 4)
    assert math.isnan(dd.allan(white[:10], 4))  # fewer than 3 windows: no estimate
