"""bench/ab_side_bias.py on synthetic logs: a bias put in at one context is found there and nowhere else."""

from __future__ import annotations

import importlib.util
import math
import random
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "sb", Path(__file__).resolve().parents[1] / "bench" / "ab_side_bias.py"
)
sb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sb)


def _log(path: Path, seed: int, bias: dict[int, float], runs: int = 2, sd: float = 0.01) -> Path:
    rng = random.Random(seed)
    lines = []
    for run in range(1, runs + 1):
        lines.append(f"evalbot: calibration run {run}/{runs}: HEAD (abc) against itself")
        for block in range(1, 7):
            lines.append("evalbot: main's serving engine ready in 4.1 s")
            for ctx in (128, 512):
                for pair in (1, 2):
                    main = 6.0
                    pr = main * math.exp(bias.get(ctx, 0.0) + rng.gauss(0, sd))
                    lines.append(
                        f"evalbot: block {block} ctx {ctx} pair {pair}: main {main:.4f} tok/s, "
                        f"PR {pr:.4f} tok/s ({pr / main - 1:+.1%})"
                    )
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_bias_at_one_context_is_found_there_alone(tmp_path):
    logs = [_log(tmp_path / f"calib_{i}.log", i, {128: -0.0125}) for i in range(6)]
    pairs = [p for log in logs for p in sb.read_pairs(log)]
    assert len(pairs) == 6 * 2 * 6 * 2 * 2
    assert len({p["run"] for p in pairs}) == 12  # two runs a log, each its own
    got = sb.analyse(pairs)
    at128, at512 = got["128"]["runs"], got["512"]["runs"]
    assert abs(at128["mean_pct"] + 1.25) < 0.3 and at128["t"] < -5 and at128["agreed"]
    assert abs(at512["mean_pct"]) < 0.3 and not at512["agreed"]
    splits = got["128"]["splits"]
    assert splits["main opens"]["n"] == splits["PR opens"]["n"] == 72


def test_the_opener_follows_the_harness_rule():
    """Main opens pair i of block b (both from 0) when i + b is even (abtest._pair); the log counts from 1."""
    line = "evalbot: block {} ctx 128 pair {}: main 6.00 tok/s, PR 6.00 tok/s (+0.0%)"
    opens = {
        (b, p): sb.read_pairs_from_text(line.format(b, p))[0]["main_opens"] for b in (1, 2) for p in (1, 2)
    }
    assert opens == {(1, 1): True, (1, 2): False, (2, 1): False, (2, 2): True}


def test_cli_says_when_a_log_has_no_pairs(tmp_path, capsys):
    empty = tmp_path / "empty.log"
    empty.write_text("evalbot: building base abc\n")
    assert sb.main([str(empty)]) == 2
    assert "no timed pairs" in capsys.readouterr().err
