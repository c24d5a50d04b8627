"""bench/variance_breakdown.py's arithmetic on synthetic samples: the split it prints must be the one put in."""

from __future__ import annotations

import importlib.util
import math
import random
from pathlib import Path

from evalbot.evaluate import ab_samples
from evalbot.model import Side

spec = importlib.util.spec_from_file_location(
    "vb", Path(__file__).resolve().parents[1] / "bench" / "variance_breakdown.py"
)
vb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vb)


def _samples(order_effect=0.01, block_sd=0.005, pair_sd=0.004, blocks=12, pairs=6):
    rng = random.Random(4)
    out = []
    for b in range(blocks):
        first = b % 2 == 0
        offset = rng.gauss(0, block_sd) + (order_effect if first else -order_effect)
        for i in range(pairs):
            base = 10.0
            head = base * math.exp(offset + rng.gauss(0, pair_sd))
            for side, tps in ((Side.BASE, base), (Side.HEAD, head)):
                out.append(
                    ab_samples.Sample(
                        side,
                        128,
                        b,
                        i,
                        (1,),
                        tuple(range(25)),
                        100.0,
                        tps,
                        {},
                        decode_s=24 / tps,
                        decode_cpu_s=47 / tps,
                        steal_ticks=1,
                        switches=(3, 2),
                        base_first=first,
                        went_first=(side is Side.BASE) == ((i + b) % 2 == 0),
                    )
                )
    return out


def test_the_breakdown_recovers_the_sources_put_in():
    res = vb.breakdown(_samples())
    row = res["contexts"][128]["decode"]
    assert abs(row["load_order_effect"] - 0.01) < 0.004
    assert abs(row["within_sd"] - 0.004) < 0.0015
    assert abs(row["between_sd"] - 0.005) < 0.003
    assert res["contexts"][128]["utilization_by_side"]["base"] > 1.9
    table = vb.table(res)
    assert "| 128 | decode |" in table and "| 128 | utilization |" in table
