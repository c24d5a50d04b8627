"""The A/A summary's arithmetic: the sign test and the table read from calibrate's own output files."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("cpu_judge_summary", ROOT / "bench" / "cpu_judge_summary.py")
summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(summary)


def test_sign_test_is_the_exact_two_sided_binomial():
    assert summary.sign_test(5, 10) == 1.0
    assert abs(summary.sign_test(9, 10) - 22 / 1024) < 1e-12  # the 9 of 10: p = 0.021
    assert summary.sign_test(0, 0) == 1.0


def test_aa_rows_read_calibrate_json_and_its_log(tmp_path, capsys):
    row = {
        "context": 128,
        "mde": 0.009,
        "details": {"ratios": [1.003], "ci": [[0.995, 1.011]], "metric": "decode_cpu_tps"},
    }
    (tmp_path / "aa1.json").write_text(json.dumps({"rows": [row]}))
    (tmp_path / "aa1.err").write_text(
        "evalbot: block 1 ctx 128 pair 1: main 8.00 tok/s, PR 8.08 tok/s (+1.0%)\n"
        "evalbot: block 1 ctx 128 pair 2: main 8.08 tok/s, PR 8.00 tok/s (-1.0%)\n"
        "evalbot: A/B done after 8 blocks (401 s): no further pair could change the decision\n"
        "evalbot: calibration run 1/1: PASS\n"
    )
    (tmp_path / "aa2.json").write_text("")
    (tmp_path / "aa2.err").write_text("Traceback\nOSError: disk\n")
    rows = summary.aa_rows(tmp_path)
    assert [r["verdict"] for r in rows] == ["PASS", "failed: OSError: disk"]
    summary.print_aa(rows)
    out = capsys.readouterr().out
    assert "1.0030x [0.9950, 1.0110], 0.90% (decode_cpu_tps)" in out and "head faster in 1 of 1" in out
    assert rows[0]["pairs"] == 2 and abs(rows[0]["pair_sd"] - 0.01407) < 1e-4  # log(1.01) apart, twice
    assert "8 blocks, 401 s (no further pair could change the decision)" in out
    assert "mean ratio +0.30%" in out and rows[1]["pairs"] == 0 and rows[1]["ab"] == "-"


def test_evaluation_rows_read_each_result_and_its_time_from_the_log(tmp_path, capsys):
    est = {"context": 512, "metric": "decode_cpu_tps", "ratio": 1.0326, "ci_low": 1.027, "ci_high": 1.0382}
    for name, status, tier in (("gain31", "PASS", "XS"), ("slowdown1", "REJECT", None)):
        (tmp_path / name).mkdir()
        verdict = {"status": status, "tier": tier, "estimates": [{**est, "scored": True}]}
        (tmp_path / name / "result.json").write_text(json.dumps({"verdict": verdict}))
    (tmp_path / "log.txt").write_text(
        "2026-12-05T02:10:23Z gain3 1: exit 0 in 457 s\n2026-12-05T02:17:31Z slowdown 1: exit 1 in 323 s\n"
    )
    summary.print_evaluations(tmp_path)
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].startswith("| gain31 | PASS XS | ctx 512 decode_cpu_tps 1.0326x [1.0270, 1.0382] scored")
    assert rows[0].endswith("| 457 s |") and rows[1].startswith("| slowdown1 | REJECT  |")
    assert rows[1].endswith("| 323 s |")
