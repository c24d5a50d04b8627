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


da_spec = importlib.util.spec_from_file_location(
    "da", Path(__file__).resolve().parents[1] / "bench" / "drift_analysis.py"
)
da = importlib.util.module_from_spec(da_spec)
da_spec.loader.exec_module(da)


def test_steal_ticks_read_the_pinned_cpus_line_of_proc_stat():
    stat = "cpu  10 0 5 100 0 0 0 7 0 0\ncpu0 5 0 2 50 0 0 0 3 0 0\ncpu1 5 0 3 50 0 0 0 4 0 0\n"
    assert dd.steal_ticks(None, stat) == 7 and dd.steal_ticks(1, stat) == 4


def test_sliced_pairs_cancel_a_slow_drift_that_whole_requests_read():
    # a box whose speed drifts slowly (a sine over ~100 steps of 0.1 s), no other noise
    times = [0.1 * (1 + 0.05 * math.sin(i / 16)) for i in range(4800)]
    whole = da.spread(da.sliced_pairs(times, 1e9, 24))
    sliced = da.spread(da.sliced_pairs(times, 0.05, 24))  # a turn a step
    assert whole["sd"] > 0.01 and sliced["sd"] < whole["sd"] / 10


def test_slow_steps_are_told_apart_by_what_came_with_them():
    trace = {
        "times": [0.1] * 10 + [0.2, 0.2, 0.2],
        "cpu": [0.1] * 10 + [0.1, 0.2, 0.2],  # the first slow step was preempted
        "probe": [1e-4] * 10 + [1e-4, 3e-4, 1e-4],  # the second came with a slow core
    }
    got = da.slow_steps(trace)
    assert (got["slow"], got["slow_preempted"], got["slow_core"], got["slow_memory"]) == (3, 1, 1, 1)
