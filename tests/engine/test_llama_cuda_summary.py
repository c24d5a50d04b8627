"""bench/llama_cuda_summary.py: picks llama-bench's tg@depth and pp tests, reads a JSON array cut short
by a timeout, and divides our engine's decode tok/s by llama.cpp's."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "llama_cuda_summary", Path(__file__).resolve().parents[2] / "bench" / "llama_cuda_summary.py"
)
lcs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lcs)


def _test(n_prompt, n_gen, n_depth, samples):
    return {
        "build_commit": "0c1e570",
        "gpu_info": "NVIDIA H200",
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "n_depth": n_depth,
        "avg_ts": sum(samples) / len(samples),
        "stddev_ts": 1.0,
        "samples_ts": samples,
    }


TESTS = [
    _test(4096, 0, 0, [9000.0, 9100.0, 9200.0]),
    _test(0, 128, 0, [160.0, 161.0, 162.0]),
    _test(4096, 0, 4096, [7000.0, 7100.0, 7200.0]),
    _test(0, 128, 4096, [150.0, 152.0, 151.0]),
]


def _engine(out: Path, decode=(190.0, 196.0, 195.0)):
    rec = {
        "decode_tps": sorted(decode)[1],
        "decode_tps_runs": list(decode),
        "prefill_tps": 12000.0,
        "random_weights": True,
        "config": {"dtype": "bfloat16"},
    }
    (out / "engine_bench.json").write_text(json.dumps(rec))


def test_ratio_from_both_records(tmp_path):
    (tmp_path / "llama_bench.json").write_text(json.dumps(TESTS, indent=2))
    (tmp_path / "llama_build.json").write_text(json.dumps({"status": "ok", "build_s": 301.5}))
    _engine(tmp_path)
    assert (
        lcs.main([str(tmp_path), "--ctx", "4096", "--gen", "128", "--engine-cmd", "python3 -m engine bench"])
        == 0
    )
    s = json.loads((tmp_path / "llama_vs_engine.json").read_text())
    assert s["llama"]["decode_tps_median"] == 151.0  # tg128 @ d4096, not tg128 @ d0
    assert s["llama"]["prefill_tps_median"] == 9100.0  # pp4096 @ d0
    assert abs(s["decode_ratio_engine_over_llama"] - 195.0 / 151.0) < 1e-9
    md = (tmp_path / "llama_vs_engine.md").read_text()
    assert "**ok** in 301.5 s" in md and "1.291" in md and "python3 -m engine bench" in md


def test_a_cut_short_array_keeps_its_whole_records(tmp_path):
    text = json.dumps(TESTS, indent=2)
    cut = text[: text.rfind('"samples_ts"')]  # killed while printing the last record
    (tmp_path / "llama_bench.json").write_text(cut)
    records = lcs.llama_records(tmp_path / "llama_bench.json")
    assert [(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in records] == [
        (4096, 0, 0),
        (0, 128, 0),
        (4096, 0, 4096),
    ]


def test_a_failed_build_still_reports_the_engine(tmp_path):
    (tmp_path / "llama_build.json").write_text(
        json.dumps({"status": "timed out (did not fit)", "build_s": 340.2})
    )
    _engine(tmp_path)
    s = lcs.summarize(tmp_path, 4096, 128)
    assert s["llama"]["decode_tps_median"] is None and s["decode_ratio_engine_over_llama"] is None
    assert s["engine"]["decode_tps_median"] == 195.0
    md = lcs.markdown(s)
    assert "timed out (did not fit)" in md and "340.2 s" in md
