"""engine.compare: llama.cpp-style KL statistics between two (P, V) log-prob arrays, and its file checks."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from evalbot.reference.compare import CompareError, check_same_tokens, compare_files, compare_logprobs, main


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return (x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))).astype(np.float32)


def _random_case(p: int = 40, v: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ref = _log_softmax(rng.normal(0, 3, size=(p, v)))
    targets = rng.integers(0, v, size=p)
    return ref, targets


def test_identical_inputs_agree_exactly():
    ref, targets = _random_case()
    s = compare_logprobs(ref, ref.copy(), targets)
    assert s["kl_mean"] == 0.0 and s["kl_max"] == 0.0 and s["kl_mean_llama"] == 0.0
    assert s["top1_agreement"] == 1.0 and s["same_top_p"] == 1.0 and s["same_top_p_err"] == 0.0
    assert s["ppl_ratio"] == 1.0 and s["ppl_ref"] == s["ppl_test"]
    assert s["delta_p_mean"] == 0.0 and s["delta_p_rms"] == 0.0
    assert s["first_top1_mismatch"] is None
    assert s["ref_norm_err_max"] < 1e-5


def test_hand_computed_two_positions_three_tokens():
    ref = np.log(np.array([[0.5, 0.25, 0.25], [0.2, 0.3, 0.5]], dtype=np.float32))
    test = np.log(np.array([[0.25, 0.5, 0.25], [0.2, 0.3, 0.5]], dtype=np.float32))
    s = compare_logprobs(ref, test, np.array([0, 2]))
    ln2 = math.log(2)
    # row 0: 0.5 ln(0.5/0.25) + 0.25 ln(0.25/0.5) + 0 = 0.25 ln 2; row 1: identical, 0
    assert s["kl_max"] == pytest.approx(0.25 * ln2, rel=1e-6)
    assert s["kl_mean"] == pytest.approx(0.125 * ln2, rel=1e-6)
    assert s["kl_median"] == pytest.approx(0.125 * ln2, rel=1e-6)
    assert s["kl_mean_llama"] == pytest.approx(0.125 * ln2, rel=1e-6)
    assert s["kl_max_position"] == 0
    assert s["top1_agreement"] == 0.5 and s["first_top1_mismatch"] == 0
    assert s["same_top_p_err"] == pytest.approx(math.sqrt(0.5 * 0.5 / 1))
    # nll_ref = [ln 2, ln 2] -> ppl 2; nll_test = [2 ln 2, ln 2] -> ppl 2^1.5
    assert s["ppl_ref"] == pytest.approx(2.0, rel=1e-6)
    assert s["ppl_test"] == pytest.approx(2**1.5, rel=1e-6)
    assert s["ppl_ratio"] == pytest.approx(math.sqrt(2), rel=1e-6)
    # delta_p = [0.25 - 0.5, 0]
    assert s["delta_p_mean"] == pytest.approx(-0.125, rel=1e-6)
    assert s["delta_p_rms"] == pytest.approx(math.sqrt(0.0625 / 2), rel=1e-6)


def test_shifted_distribution_has_positive_kl():
    ref, targets = _random_case(seed=1)
    rng = np.random.default_rng(2)
    test = _log_softmax(ref + rng.normal(0, 0.5, size=ref.shape))
    s = compare_logprobs(ref, test, targets)
    assert s["kl_mean"] > 1e-3 and s["kl_median"] > 0 and s["kl_max"] >= s["kl_p99"] >= s["kl_median"]
    assert 0.0 <= s["top1_agreement"] <= 1.0


def test_chunking_does_not_change_the_result():
    # more positions than one block, so the per-block loop is exercised at a boundary
    ref, targets = _random_case(p=37, v=50, seed=3)
    test = _log_softmax(ref * 1.1)
    whole = compare_logprobs(ref, test, targets)
    for i in range(37):
        one = compare_logprobs(ref[i : i + 1], test[i : i + 1], targets[i : i + 1])
        assert one["kl_mean"] == pytest.approx(_kl_row(ref[i], test[i]), rel=1e-9, abs=1e-15)
    assert whole["kl_mean"] == pytest.approx(
        np.mean([_kl_row(a, b) for a, b in zip(ref, test, strict=True)]), rel=1e-9
    )


def _kl_row(lp: np.ndarray, lq: np.ndarray) -> float:
    lp, lq = lp.astype(np.float64), lq.astype(np.float64)
    return float(np.sum(np.exp(lp) * (lp - lq)))


def test_llama_variant_drops_terms_below_the_floor():
    # token 2 has log p_ref = ln 1e-9 < -16: the full KL counts its term, llama.cpp's variant does not
    lp = np.log(np.array([[0.5, 0.5 - 1e-9, 1e-9]])).astype(np.float32)
    lq = np.log(np.array([[0.4, 0.4, 0.2]])).astype(np.float32)
    s = compare_logprobs(lp, lq, np.array([0]))
    a, b = lp[0].astype(np.float64), lq[0].astype(np.float64)
    terms = np.exp(a) * (a - b)
    assert s["kl_mean"] == pytest.approx(terms.sum(), rel=1e-12)
    assert s["kl_mean_llama"] == pytest.approx(terms[:2].sum(), rel=1e-12)
    assert s["kl_mean"] - s["kl_mean_llama"] == pytest.approx(terms[2], rel=1e-6)


def test_bad_shapes_and_targets_raise():
    ref, targets = _random_case(p=4, v=10)
    with pytest.raises(CompareError):
        compare_logprobs(ref, ref[:3], targets)
    with pytest.raises(CompareError):
        compare_logprobs(ref, ref, targets[:3])
    with pytest.raises(CompareError):
        compare_logprobs(ref, ref, np.array([0, 1, 2, 10]))


def test_mismatched_ids_raise():
    a = {"token_ids": [1, 2, 3]}
    check_same_tokens(a, {"token_ids": [1, 2, 3]}, (2, 5), (2, 5))
    with pytest.raises(CompareError, match="scored different tokens"):
        check_same_tokens(a, {"token_ids": [1, 2, 4]}, (2, 5), (2, 5))
    with pytest.raises(CompareError, match="different shapes"):
        check_same_tokens(a, {"token_ids": [1, 2, 3]}, (2, 5), (2, 6))


def _write_score(path, arr, ids, engine="x"):
    np.save(path, arr)
    path.with_name(path.name + ".json").write_text(
        json.dumps({"engine": engine, "model_sha256": "0" * 64, "token_ids": ids})
    )


def test_cli_prints_one_json_record_and_a_table(tmp_path, capsys):
    ref, _ = _random_case(p=5, v=20)
    ids = [1, 2, 3, 4, 5, 6]
    _write_score(tmp_path / "ref.npy", ref, ids, "llama.cpp")
    _write_score(tmp_path / "test.npy", _log_softmax(ref * 0.9), ids, "evalbot-engine")
    assert main([str(tmp_path / "ref.npy"), str(tmp_path / "test.npy"), "--json"]) == 0
    out, err = capsys.readouterr()
    record = json.loads(out)
    assert record["command"] == "compare" and record["positions"] == 5 and record["kl_mean"] > 0
    assert record["ref_engine"] == "llama.cpp" and record["test_engine"] == "evalbot-engine"
    assert "Mean KLD" in err and "Same top p" in err


def test_cli_refuses_different_tokens(tmp_path, capsys):
    ref, _ = _random_case(p=5, v=20)
    _write_score(tmp_path / "ref.npy", ref, [1, 2, 3, 4, 5, 6])
    _write_score(tmp_path / "test.npy", ref, [1, 2, 3, 4, 5, 7])
    assert main([str(tmp_path / "ref.npy"), str(tmp_path / "test.npy")]) == 2
    assert "scored different tokens" in capsys.readouterr().err
    with pytest.raises(CompareError, match="scored different tokens"):
        compare_files(tmp_path / "ref.npy", tmp_path / "test.npy")


def test_cli_refuses_non_finite_log_probs(tmp_path):
    ref, _ = _random_case(p=5, v=20)
    bad = ref.copy()
    bad[3, 7] = np.nan
    _write_score(tmp_path / "ref.npy", ref, [1, 2, 3, 4, 5, 6])
    _write_score(tmp_path / "test.npy", bad, [1, 2, 3, 4, 5, 6])
    with pytest.raises(CompareError, match="non-finite log-probs at position 3"):
        compare_files(tmp_path / "ref.npy", tmp_path / "test.npy")


@pytest.mark.parametrize(
    "garbage",
    [
        "objects",  # a pickle: np.load never unpickles, so it cannot run code in the harness
        "ints",  # numbers, but not log-probs
        "complex",  # floats' shape, not floats
        "truncated",  # a header that claims more than the file holds
        "text",  # no .npy at all
    ],
)
def test_an_engines_garbage_score_file_is_refused_as_data(tmp_path, garbage):
    """evalbot's comparison runs in the harness's own process: what an engine wrote is read as data only,
    and anything but a float array of the reference's shape is a clear error (the side's failure)."""
    ref, _ = _random_case(p=5, v=20)
    ids = [1, 2, 3, 4, 5, 6]
    _write_score(tmp_path / "ref.npy", ref, ids)
    test = tmp_path / "test.npy"
    if garbage == "objects":
        np.save(test, np.array([{"__reduce__": 1}] * 5, dtype=object), allow_pickle=True)
    elif garbage == "ints":
        np.save(test, np.zeros((5, 20), dtype=np.int32))
    elif garbage == "complex":
        np.save(test, np.zeros((5, 20), dtype=np.complex64))
    elif garbage == "truncated":
        np.save(test, ref)
        test.write_bytes(test.read_bytes()[:200])
    else:
        test.write_text("not an array\n")
    test.with_name("test.npy.json").write_text(json.dumps({"token_ids": ids}))
    with pytest.raises(CompareError, match=f"{test}"):
        compare_files(tmp_path / "ref.npy", test)


def test_an_http_engines_top_k_rows_are_compared_over_the_k_and_one_bucket_of_the_rest():
    """An HTTP engine gives each position's top K log-probs only; the relay spreads the rest of the mass
    evenly (dense_row). Compared over the whole vocabulary, the same model's numbers read a KL of about
    0.45 nats and a PPL ratio of 1.9 (the llama.cpp contest, judging llama-server against llama.cpp); over
    the K and one bucket of the rest, on both sides, the same distribution reads 0, and a changed one
    reads what changed."""
    from evalbot.evaluate.http_relay import dense_row

    rng = np.random.default_rng(3)
    v, k, p = 5000, 64, 12
    logits = rng.normal(0, 3, size=(p, v))
    ref = (logits - np.log(np.exp(logits).sum(1, keepdims=True))).astype(np.float32)
    targets = rng.integers(0, v, size=p)

    def top_k_rows(lp: np.ndarray) -> np.ndarray:
        rows = []
        for row in lp:
            top = np.argsort(-row)[:k]
            rows.append(np.frombuffer(dense_row([(int(i), float(row[i])) for i in top], v), dtype=np.float32))
        return np.stack(rows)

    same = compare_logprobs(ref, top_k_rows(ref), targets)
    assert same["coarse_positions"] == p and same["top1_agreement"] == 1.0
    assert same["kl_mean"] == pytest.approx(0.0, abs=1e-5) and same["ppl_ratio"] == pytest.approx(
        1.0, abs=1e-4
    )
    full = compare_logprobs(ref, ref, targets)
    assert full["coarse_positions"] == 0 and full["kl_mean"] == pytest.approx(0.0, abs=1e-6)
    shifted = ref.copy()
    shifted[:, :] += rng.normal(0, 0.3, size=(p, v)).astype(np.float32)
    shifted -= np.log(np.exp(shifted.astype(np.float64)).sum(1, keepdims=True)).astype(np.float32)
    moved = compare_logprobs(ref, top_k_rows(shifted), targets)
    assert moved["kl_mean"] > 0.01  # a real change still shows
