"""Compare two score outputs (reference vs test log-probabilities) with llama.cpp's KL-divergence statistics.

Both inputs are ``score`` outputs: a (P, V) float32 .npy of full-vocabulary log-probabilities and its
``.npy.json`` record, whose ``token_ids`` must be identical (else the comparison means nothing). KL(ref‖test)
is summed over the full vocabulary in float64, a block of rows at a time; ``kl_mean_llama`` keeps only the
terms with log p_ref > −16, as llama.cpp's ``perplexity --kl-divergence`` does. The JSON record goes to
stdout, a readable table to stderr.

    python -m evalbot.reference.compare ref.npy test.npy
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from evalbot.reference.record import emit, make_record

LLAMA_LOGP_FLOOR = -16.0  # llama.cpp's cut-off for KL terms
_MAX_TOP_K = 1024  # a row with all but at most this many ids at one floor value gives only its top K
_ROW_CHUNK = 16  # rows per float64 block: 16 x 151936 x 8 B is about 19 MB per array


class CompareError(ValueError):
    """Two score outputs that cannot be compared, with the reason."""


def compare_logprobs(ref: np.ndarray, test: np.ndarray, targets: np.ndarray) -> dict[str, Any]:
    """llama.cpp-style statistics of test against ref, (P, V) log-probs whose row i predicts targets[i]."""
    if ref.ndim != 2 or ref.shape != test.shape:
        raise CompareError(f"log-prob arrays must be (P, V) of equal shape, got {ref.shape} and {test.shape}")
    n, v = ref.shape
    targets = np.asarray(targets, dtype=np.int64)
    if targets.shape != (n,):
        raise CompareError(f"need {n} targets, one per position, got shape {targets.shape}")
    if n == 0:
        raise CompareError("nothing to compare: 0 positions")
    if targets.min() < 0 or targets.max() >= v:
        raise CompareError(f"targets outside the vocabulary 0..{v - 1}")

    kl = np.empty(n)
    kl_llama = np.empty(n)
    same_top = np.empty(n, dtype=bool)
    norm_err = np.empty((2, n))
    lp_t = np.asarray(ref[np.arange(n), targets], dtype=np.float64)
    lq_t = np.asarray(test[np.arange(n), targets], dtype=np.float64)
    coarse = 0
    for s in range(0, n, _ROW_CHUNK):
        lp = np.asarray(ref[s : s + _ROW_CHUNK], dtype=np.float64)
        lq = np.asarray(test[s : s + _ROW_CHUNK], dtype=np.float64)
        p = np.exp(lp)
        # A zero-probability ref token contributes nothing, even where test is -inf too (no 0 * nan).
        terms = np.where(p > 0, p * (lp - lq), 0.0)
        # A row that gives only its top K (an HTTP engine's n_probs) spreads the rest of its mass evenly over
        # one floor value: there KL is taken over the K and one bucket of the rest, for both sides (the
        # coarse-grained KL, a lower bound of the full one), and a target in the bucket gets its share.
        bucket = lq == lq.min(axis=1, keepdims=True)
        truncated = (
            bucket.sum(axis=1) >= v - _MAX_TOP_K if v > 2 * _MAX_TOP_K else np.zeros(len(lq), dtype=bool)
        )
        if truncated.any():
            p_b = np.where(bucket, p, 0.0).sum(axis=1)
            q_b = bucket.sum(axis=1) * np.exp(lq.min(axis=1))
            bucket_term = np.where(p_b > 0, p_b * (np.log(np.maximum(p_b, 1e-300)) - np.log(q_b)), 0.0)
            terms = np.where(truncated[:, None] & bucket, 0.0, terms)
            rows = np.flatnonzero(truncated)
            for r in rows:
                i = s + r
                if bucket[r, targets[i]]:  # the target's share of the bucket, on both sides
                    lp_t[i] = np.log(max(p_b[r], 1e-300)) - np.log(bucket[r].sum())
                    lq_t[i] = np.log(q_b[r]) - np.log(bucket[r].sum())
            coarse += len(rows)
        else:
            bucket_term = np.zeros(len(lp))
        kl[s : s + _ROW_CHUNK] = terms.sum(axis=1) + np.where(truncated, bucket_term, 0.0)
        kl_llama[s : s + _ROW_CHUNK] = np.where(lp > LLAMA_LOGP_FLOOR, terms, 0.0).sum(axis=1) + np.where(
            truncated, bucket_term, 0.0
        )
        same_top[s : s + _ROW_CHUNK] = lp.argmax(axis=1) == lq.argmax(axis=1)
        norm_err[0, s : s + _ROW_CHUNK] = np.abs(np.log(p.sum(axis=1)))
        norm_err[1, s : s + _ROW_CHUNK] = np.abs(np.log(np.exp(lq).sum(axis=1)))

    nll_ref, nll_test = -lp_t.mean(), -lq_t.mean()
    delta_p = np.exp(lq_t) - np.exp(lp_t)
    top = float(same_top.mean())
    mismatches = np.flatnonzero(~same_top)
    return {
        "positions": n,
        "n_vocab": v,
        "top1_agreement": top,
        "first_top1_mismatch": int(mismatches[0]) if mismatches.size else None,
        "kl_mean": float(kl.mean()),
        "coarse_positions": coarse,  # rows of only the top K: KL over the K and one bucket of the rest
        # llama.cpp's uncertainty of the mean: the sample standard deviation over sqrt(n - 1)
        "kl_mean_err": float(kl.std() / math.sqrt(n - 1)) if n > 1 else 0.0,
        "kl_median": float(np.median(kl)),
        "kl_p99": float(np.percentile(kl, 99)),
        "kl_max": float(kl.max()),
        "kl_max_position": int(kl.argmax()),
        "kl_mean_llama": float(kl_llama.mean()),
        "ppl_ref": float(math.exp(nll_ref)),
        "ppl_test": float(math.exp(nll_test)),
        "ppl_ratio": float(math.exp(nll_test - nll_ref)),
        "same_top_p": top,
        "same_top_p_err": math.sqrt(top * (1 - top) / (n - 1)) if n > 1 else 0.0,
        "delta_p_mean": float(delta_p.mean()),
        "delta_p_rms": float(np.sqrt(np.mean(delta_p**2))),
        "ref_norm_err_max": float(norm_err[0].max()),
        "test_norm_err_max": float(norm_err[1].max()),
    }


def load_score(path: str | Path) -> tuple[np.ndarray, dict[str, Any]]:
    """A score output: its (P, V) log-probs (memory-mapped) and the record in its .npy.json sidecar."""
    path = Path(path)
    sidecar = Path(f"{path}.json")
    try:
        arr = np.load(path, mmap_mode="r")  # never pickles; a header that claims more than the file fails
    except (OSError, ValueError) as exc:
        raise CompareError(f"cannot read {path}: {exc}") from exc
    if arr.dtype.kind != "f" or arr.dtype.itemsize > 8:
        raise CompareError(f"{path}: expected float32 or float64 log-probs, got {arr.dtype}")
    try:
        record = json.loads(sidecar.read_text())
    except (OSError, ValueError) as exc:
        raise CompareError(f"cannot read the score record {sidecar} next to {path.name}: {exc}") from exc
    if not isinstance(record, dict) or not isinstance(record.get("token_ids"), list):
        raise CompareError(f"{sidecar} has no token_ids: is it a score record?")
    if arr.ndim != 2 or arr.shape[0] != len(record["token_ids"]) - 1:
        raise CompareError(
            f"{path}: shape {arr.shape} does not fit its record ({len(record['token_ids'])} token ids -> "
            f"{len(record['token_ids']) - 1} positions)"
        )
    return arr, record


def check_same_tokens(
    ref_record: dict[str, Any],
    test_record: dict[str, Any],
    ref_shape: tuple[int, ...],
    test_shape: tuple[int, ...],
) -> None:
    """Raise CompareError unless both records scored the same token ids into equally shaped arrays."""
    a, b = ref_record.get("token_ids"), test_record.get("token_ids")
    if a != b:
        where = ""
        if isinstance(a, list) and isinstance(b, list):
            first = next(
                (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
            )
            where = f" ({len(a)} vs {len(b)} ids; first difference at index {first})"
        raise CompareError(f"the two score files scored different tokens{where}")
    if tuple(ref_shape) != tuple(test_shape):
        raise CompareError(
            f"the two score files have different shapes: {tuple(ref_shape)} vs {tuple(test_shape)}"
        )


def _check_finite(arr: np.ndarray, name: str) -> None:
    for s in range(0, arr.shape[0], _ROW_CHUNK):
        bad = ~np.isfinite(arr[s : s + _ROW_CHUNK]).all(axis=1)
        if bad.any():
            raise CompareError(
                f"{name} has non-finite log-probs at position {s + int(np.flatnonzero(bad)[0])}"
            )


def format_table(stats: dict[str, Any], ref_name: str, test_name: str) -> str:
    """The statistics as llama.cpp's perplexity tool lays them out, for people."""
    s = stats
    lines = [
        f"reference: {ref_name}",
        f"test:      {test_name}",
        f"positions:        {s['positions']}",
        f"PPL(ref):         {s['ppl_ref']:.6f}",
        f"PPL(test):        {s['ppl_test']:.6f}",
        f"PPL ratio:        {s['ppl_ratio']:.6f}",
        f"Mean KLD:         {s['kl_mean']:.6g} ± {s['kl_mean_err']:.3g}  (llama.cpp's, log p > -16: {s['kl_mean_llama']:.6g})",
        f"Median KLD:       {s['kl_median']:.6g}",
        f"99% KLD:          {s['kl_p99']:.6g}",
        f"Max KLD:          {s['kl_max']:.6g}  (position {s['kl_max_position']})",
        f"Same top p:       {100 * s['same_top_p']:.3f} ± {100 * s['same_top_p_err']:.3f} %"
        + (
            f"  (first mismatch at position {s['first_top1_mismatch']})"
            if s["first_top1_mismatch"] is not None
            else ""
        ),
        f"Mean Δp:          {100 * s['delta_p_mean']:.4f} %",
        f"RMS Δp:           {100 * s['delta_p_rms']:.4f} %",
        f"max |logsumexp|:  ref {s['ref_norm_err_max']:.2g}, test {s['test_norm_err_max']:.2g}",
    ]
    return "\n".join(lines)


def compare_files(ref_path: str | Path, test_path: str | Path) -> dict[str, Any]:
    """Load, check and compare two score outputs; the protocol record of the comparison."""
    t0 = time.perf_counter()
    ref, ref_rec = load_score(ref_path)
    test, test_rec = load_score(test_path)
    check_same_tokens(ref_rec, test_rec, ref.shape, test.shape)
    _check_finite(ref, str(ref_path))
    _check_finite(test, str(test_path))
    stats = compare_logprobs(ref, test, np.asarray(ref_rec["token_ids"][1:]))
    return make_record(
        "compare",
        engine="compare",
        model_sha256=str(ref_rec.get("model_sha256", "")),
        device="cpu",
        config={"ref": str(ref_path), "test": str(test_path), "kl_llama_logp_floor": LLAMA_LOGP_FLOOR},
        timings={"compare_s": time.perf_counter() - t0},
        counts={"positions": stats["positions"], "n_vocab": stats["n_vocab"]},
        ref_engine=ref_rec.get("engine"),
        test_engine=test_rec.get("engine"),
        test_model_sha256=test_rec.get("model_sha256"),
        **stats,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m evalbot.reference.compare", description=__doc__.splitlines()[0]
    )
    parser.add_argument("ref", metavar="REF.npy", help="reference score output (its .npy.json next to it)")
    parser.add_argument("test", metavar="TEST.npy", help="score output under test")
    parser.add_argument(
        "--json", action="store_true", help="accepted for clarity: the JSON record is always on stdout"
    )
    args = parser.parse_args(argv)
    try:
        record = compare_files(args.ref, args.test)
    except CompareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        format_table(
            record, f"{args.ref} ({record['ref_engine']})", f"{args.test} ({record['test_engine']})"
        ),
        file=sys.stderr,
    )
    emit(record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
