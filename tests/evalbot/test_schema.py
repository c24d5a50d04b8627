"""Engine records are untrusted: evalbot.evaluate.schema accepts the engine's real shapes and nothing odd."""

from __future__ import annotations

import copy
import json
import math

import pytest

from evalbot.evaluate.schema import RecordError, parse_and_validate, parse_record, validate

SHA = "ab" * 32


def _common(command: str, counts: dict, timings: dict) -> dict:
    return {
        "schema": f"evalbot.engine.{command}/1",
        "command": command,
        "engine": "evalbot-engine",
        "model_sha256": SHA,
        "device": "cuda",
        "config": {"arch": "qwen2", "threads": 8},
        "timings": {"load_s": 1.25, **timings},
        "counts": counts,
    }


def bench_record() -> dict:
    return {
        **_common("bench", {"ctx": 512, "gen": 32, "runs": 3}, {"prefill_s": 0.3, "decode_s": 0.9}),
        "prefill_tps": 5000.0,
        "decode_tps": 120.0,
        "prefill_tps_runs": [4900.0, 5000.0, 5100.5],
        "decode_tps_runs": [119.0, 120.0, 121.0],
        "random_weights": False,
    }


def score_record() -> dict:
    nll = [2.0, 0.5, 1.25, 3.0]
    mean = sum(nll) / len(nll)
    return {
        **_common("score", {"positions": 4, "n_vocab": 1000}, {"score_s": 0.1}),
        "path": "/scratch/head.npy",
        "token_ids": [1, 5, 9, 17, 999],
        "argmax": [5, 9, 3, 2],
        "nll": nll,
        "mean_nll": mean,
        "ppl": math.exp(mean),
    }


def spec_record() -> dict:
    return {
        **_common(
            "spec",
            {"ctx": 256, "gen": 64, "runs": 3, "verify_steps": 10},
            {"ar_decode_s": 1.0, "spec_decode_s": 0.6},
        ),
        "ar_tps": 60.0,
        "spec_tps": 100.0,
        "ar_tps_runs": [59.0, 60.0, 61.0],
        "spec_tps_runs": [99.0, 100.0, 101.0],
        "mean_accept": 2.5,
        "block_size": 4,
        "accept_hist": {"1": 3, "2": 2, "3": 2, "4": 3},
        "lossless": 1,
        "lossless_runs": 3,
        "first_divergence": None,
        "ar_margin_at_divergence": None,
        "ar_token_ids": [1, 2],
        "spec_token_ids": [1, 2],
        "random_weights": False,
    }


def generate_record() -> dict:
    return {
        **_common(
            "generate",
            {"prompt_tokens": 3, "new_tokens": 2, "decode_steps": 1},
            {"prefill_s": 0.01, "decode_s": 0.02},
        ),
        "prompt": "hi",
        "token_ids": [7, 8],
        "text": "ok",
        "stop_reason": "length",
        "prefill_tps": 300.0,
        "decode_tps": 0.0,
    }


RECORDS = {"bench": bench_record, "score": score_record, "spec": spec_record, "generate": generate_record}


def line(record: dict) -> str:
    return json.dumps(record, separators=(",", ":")) + "\n"


def problems_of(record: dict, command: str) -> str:
    """validate()'s problems joined, so a test can look for its specific message."""
    problems = validate(record, command)
    assert problems, "expected the record to be rejected"
    return "; ".join(problems)


@pytest.mark.parametrize("command", sorted(RECORDS))
def test_valid_records_pass(command):
    record = RECORDS[command]()
    assert parse_and_validate("\n" + line(record) + "\n\n", command) == record


def test_sampled_spec_record_has_null_losslessness():
    record = spec_record() | {"lossless": None, "lossless_runs": None}
    assert validate(record, "spec") == []


def test_nan_in_json_is_rejected_at_parse():
    text = line(bench_record()).replace('"decode_tps":120.0', '"decode_tps":NaN')
    with pytest.raises(RecordError, match=r"not JSON .*NaN is not a number JSON allows"):
        parse_and_validate(text, "bench")


def test_overflowing_float_is_rejected_at_parse():
    text = line(bench_record()).replace('"decode_tps":120.0', '"decode_tps":1e999')
    with pytest.raises(RecordError, match="1e999 overflows to inf"):
        parse_record(text, "bench")


def test_nan_in_a_dict_is_rejected_by_validate():
    assert "decode_tps must be finite, got nan" in problems_of(
        bench_record() | {"decode_tps": math.nan}, "bench"
    )


def test_negative_throughput():
    msg = problems_of(bench_record() | {"decode_tps": -1}, "bench")
    assert "decode_tps must be > 0, got -1" in msg


def test_impossible_throughput():
    msg = problems_of(bench_record() | {"decode_tps": 1e12}, "bench")
    assert "decode_tps 1000000000000.0 is impossibly high (limit 1e+06)" in msg


def test_impossible_run_value():
    record = bench_record()
    record["prefill_tps_runs"][1] = 5e8
    assert "prefill_tps_runs[1] 500000000.0 is impossibly high" in problems_of(record, "bench")


def test_missing_field():
    record = bench_record()
    del record["prefill_tps"]
    assert problems_of(record, "bench") == "missing field 'prefill_tps'"


def test_missing_count():
    record = bench_record()
    del record["counts"]["runs"]
    assert "missing field 'counts.runs'" in problems_of(record, "bench")


def test_bool_is_not_a_number():
    assert "decode_tps must be a number, got bool true" in problems_of(
        bench_record() | {"decode_tps": True}, "bench"
    )


def test_bool_is_not_a_count():
    record = bench_record()
    record["counts"]["runs"] = True
    assert "counts.runs must be a non-negative integer, got bool true" in problems_of(record, "bench")


def test_negative_timing():
    record = bench_record()
    record["timings"]["decode_s"] = -0.5
    assert "timings.decode_s must be >= 0, got -0.5" in problems_of(record, "bench")


def test_runs_disagree_with_counts():
    record = bench_record() | {"decode_tps_runs": [120.0, 121.0]}
    assert "decode_tps_runs has 2 entries but counts.runs is 3" in problems_of(record, "bench")


def test_headline_must_be_the_median_of_the_runs():
    msg = problems_of(bench_record() | {"decode_tps": 150.0}, "bench")
    assert "decode_tps 150.0 is not the median of decode_tps_runs (120.0)" in msg


def test_two_json_lines():
    with pytest.raises(RecordError, match="stdout held 2 JSON lines"):
        parse_and_validate(line(bench_record()) * 2, "bench")


def test_stray_text_beside_the_record():
    with pytest.raises(RecordError, match="stdout held 2 non-blank lines"):
        parse_and_validate("loading model...\n" + line(bench_record()), "bench")


def test_garbage_text():
    with pytest.raises(RecordError, match=r"^not JSON \(.*\): 'Segmentation fault"):
        parse_and_validate("Segmentation fault (core dumped)\n", "bench")


def test_long_garbage_is_clipped():
    with pytest.raises(RecordError) as exc:
        parse_record("x" * 10_000, "bench")
    assert len(str(exc.value)) < 400


def test_empty_stdout():
    with pytest.raises(RecordError, match="printed nothing on stdout"):
        parse_and_validate(" \n\n", "bench")


def test_json_that_is_not_an_object():
    with pytest.raises(RecordError, match="the record is a JSON list, not an object"):
        parse_and_validate("[1, 2]", "bench")


def test_wrong_schema():
    msg = problems_of(bench_record() | {"schema": "evalbot.engine.bench/2"}, "bench")
    assert msg == "schema is 'evalbot.engine.bench/2', expected 'evalbot.engine.bench/1'"


def test_wrong_command():
    # a score record handed in where a bench record was asked for: both the schema and command say so
    msg = problems_of(score_record(), "bench")
    assert "command is 'score', expected 'bench'" in msg
    assert "schema is 'evalbot.engine.score/1', expected 'evalbot.engine.bench/1'" in msg


def test_bad_model_sha():
    assert "model_sha256 is not 64 lowercase hex digits" in problems_of(
        bench_record() | {"model_sha256": "AB" * 32}, "bench"
    )


def test_score_length_mismatch():
    record = score_record()
    record["argmax"] = record["argmax"][:-1]
    assert "argmax has 3 entries but counts.positions is 4" in problems_of(record, "score")


def test_score_token_ids_need_one_more_than_positions():
    record = score_record()
    record["token_ids"] = record["token_ids"][:-1]
    assert "token_ids has 4 entries but counts.positions + 1 is 5" in problems_of(record, "score")


def test_score_negative_nll():
    record = score_record()
    record["nll"][2] = -0.1
    assert "nll[2] must be >= 0, got -0.1" in problems_of(record, "score")


def test_score_ppl_inconsistent():
    record = score_record()
    record["ppl"] *= 1.001
    assert "ppl " in problems_of(record, "score") and "is not exp(mean_nll)" in problems_of(record, "score")


def test_score_mean_nll_inconsistent():
    msg = problems_of(score_record() | {"mean_nll": 0.1, "ppl": math.exp(0.1)}, "score")
    assert "mean_nll 0.1 is not the mean of nll (1.6875)" in msg


def test_score_token_outside_vocabulary():
    record = score_record()
    record["argmax"][0] = 1000
    assert "argmax holds 1000, outside the vocabulary of 1000" in problems_of(record, "score")


def test_spec_mean_accept_above_block():
    assert "mean_accept 5.0 exceeds block_size 4" in problems_of(spec_record() | {"mean_accept": 5.0}, "spec")


def test_spec_mean_accept_below_one():
    assert "mean_accept must be >= 1, got 0.5" in problems_of(spec_record() | {"mean_accept": 0.5}, "spec")


def test_spec_hist_keys():
    record = spec_record()
    record["accept_hist"]["5"] = record["accept_hist"].pop("4")
    assert "accept_hist keys must be '1'..'4'" in problems_of(record, "spec")


def test_spec_mean_accept_disagrees_with_hist():
    assert "disagrees with accept_hist (mean 2.5)" in problems_of(
        spec_record() | {"mean_accept": 3.0}, "spec"
    )


def test_spec_lossless_values():
    assert "lossless must be 0, 1 or null, got float 0.5" in problems_of(
        spec_record() | {"lossless": 0.5}, "spec"
    )
    assert validate(spec_record() | {"lossless": True}, "spec") == []


def test_spec_lossless_runs_bounded_by_runs():
    assert "lossless_runs 4 exceeds counts.runs 3" in problems_of(
        spec_record() | {"lossless_runs": 4}, "spec"
    )


def test_generate_token_ids_are_ints():
    msg = problems_of(generate_record() | {"token_ids": [7, "8"]}, "generate")
    assert "token_ids[1] must be a non-negative integer, got str '8'" in msg


def test_every_problem_is_listed():
    record = copy.deepcopy(bench_record()) | {"decode_tps": -1.0, "device": 3}
    del record["engine"]
    with pytest.raises(RecordError) as exc:
        parse_and_validate(line(record), "bench")
    assert len(exc.value.problems) == 3
    assert "missing field 'engine'" in str(exc.value) and "device must be a string" in str(exc.value)


def test_unknown_command_is_a_caller_bug():
    with pytest.raises(ValueError, match="unknown engine command"):
        validate(bench_record(), "train")
