"""evalbot.reference against the real Qwen2.5-Coder-0.5B file: score (with its cache), greedy generate, bench."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from importlib import resources

import numpy as np
import pytest

from evalbot.reference import cli as reference
from evalbot.reference import llama
from evalbot.reference.registry import FetchError, resolve

MODEL = "qwen2.5-coder-0.5b"
POSITIONS = 64
N_VOCAB = 151936
needs_llama = pytest.mark.reference


@pytest.fixture(scope="module")
def model_path():
    pytest.importorskip("llama_cpp")
    try:
        return resolve(MODEL)  # resolved before the cache root moves to a temporary directory
    except FetchError:
        pytest.skip(f"{MODEL} is not fetched (python -m evalbot.reference.registry fetch {MODEL})")


@pytest.fixture(scope="module")
def scored(model_path, tmp_path_factory):
    """One CLI score of the bundled corpus into a fresh cache, then the same ids again (a cache hit)."""
    tmp = tmp_path_factory.mktemp("reference")
    corpus = str(resources.files("engine").joinpath("data/corpus.txt"))
    records = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EVALBOT_CACHE", str(tmp / "cache"))
        for name, source in (
            ("first", ["--text-file", corpus]),
            ("second", ["--ids-from", str(tmp / "first.npy")]),
        ):
            out = tmp / f"{name}.npy"
            # one thread: two on a busy two-core box spin at barriers and can run 10x slower
            argv = [
                "score",
                "--model",
                str(model_path),
                *source,
                "--positions",
                str(POSITIONS),
                "--threads",
                "1",
            ]
            assert reference.main([*argv, "--out", str(out)]) == 0
            records.append((np.load(out), json.loads(out.with_name(out.name + ".json").read_text())))
    return records, tmp


def test_missing_llama_cpp_is_a_clear_error():
    code = "import sys; sys.modules['llama_cpp'] = None; from evalbot.reference.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = ["bench", "--model", "x.gguf", "--text-file", "t.txt", "--ctx", "8"]
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "python -m evalbot.reference.build install" in proc.stderr


@needs_llama
def test_score_writes_normalized_full_vocabulary_logprobs(scored):
    arr, rec = scored[0][0]
    assert arr.shape == (POSITIONS, N_VOCAB) and arr.dtype == np.float32
    x = arr.astype(np.float64)
    lse = x.max(axis=1) + np.log(np.exp(x - x.max(axis=1, keepdims=True)).sum(axis=1))
    assert np.abs(lse).max() < 1e-4
    assert rec["engine"] == "llama.cpp" and rec["command"] == "score" and rec["cached"] is False
    assert rec["counts"] == {"positions": POSITIONS, "n_vocab": N_VOCAB}
    assert rec["config"]["flash_attn"] is False and rec["config"]["n_ctx"] % 256 == 0
    ids = rec["token_ids"]
    assert len(ids) == POSITIONS + 1
    assert rec["argmax"] == arr.argmax(axis=1).tolist()
    nll = -arr[np.arange(POSITIONS), ids[1:]].astype(np.float64)
    np.testing.assert_allclose(rec["nll"], nll, rtol=0, atol=1e-6)
    assert rec["mean_nll"] == pytest.approx(nll.mean()) and rec["ppl"] == pytest.approx(math.exp(nll.mean()))
    assert 1.0 < rec["ppl"] < 100.0  # real text under a real model


@needs_llama
def test_second_score_is_a_cache_hit_with_identical_output(scored):
    (first, rec1), (second, rec2) = scored[0]
    assert rec2["cached"] is True and rec2["cache_key"] == rec1["cache_key"]
    assert rec2["token_ids"] == rec1["token_ids"]
    np.testing.assert_array_equal(first, second)
    cache_root = scored[1] / "cache" / "reference"
    assert (cache_root / f"{rec1['cache_key']}.npy").is_file()


def test_cache_key_depends_on_every_input():
    build = {"llama_cpp_python": "0.3.36", "cmake_args": "-DGGML_NATIVE=OFF", "lib_sha256": "c" * 64}
    base = llama.cache_key("a" * 64, build, False, [1, 2, 3])
    assert base == llama.cache_key("a" * 64, dict(build), False, [1, 2, 3])
    others = [
        llama.cache_key("b" * 64, build, False, [1, 2, 3]),
        llama.cache_key("a" * 64, build | {"llama_cpp_python": "0.3.37"}, False, [1, 2, 3]),
        llama.cache_key("a" * 64, build | {"cmake_args": "-DGGML_NATIVE=ON"}, False, [1, 2, 3]),
        llama.cache_key("a" * 64, build | {"lib_sha256": "d" * 64}, False, [1, 2, 3]),
        llama.cache_key("a" * 64, build, True, [1, 2, 3]),
        llama.cache_key("a" * 64, build, False, [1, 2, 4]),
    ]
    assert base not in others and len(set(others)) == 6


@needs_llama
def test_too_few_tokens_is_a_clear_error(model_path, tmp_path, capsys):
    ids = tmp_path / "short.json"
    ids.write_text(json.dumps({"token_ids": [1, 2, 3]}))
    argv = ["score", "--model", str(model_path), "--ids-from", str(ids), "--positions", "5"]
    assert reference.main([*argv, "--out", str(tmp_path / "x.npy")]) == 2
    assert "has 3 tokens; scoring 5 positions needs 6" in capsys.readouterr().err
    assert not (tmp_path / "x.npy").exists()


@needs_llama
def test_generate_returns_the_requested_tokens(model_path, scored):
    prompt = scored[0][0][1]["token_ids"][:16]
    out = llama.greedy_generate(model_path, prompt, 6, n_threads=1)
    assert len(out["token_ids"]) == 6 and len(out["margins"]) == 6
    assert all(0 <= t < N_VOCAB for t in out["token_ids"]) and all(m >= 0 for m in out["margins"])
    # greedy from the scored prefix continues as the teacher-forced argmax did at its last position
    # (unless a near-tie flipped between the two batch shapes)
    if out["margins"][0] > 0.05:
        assert out["token_ids"][0] == scored[0][0][1]["argmax"][15]


@needs_llama
def test_bench_reports_positive_finite_throughput(model_path, scored):
    prompt = scored[0][0][1]["token_ids"][:16]
    out = llama.bench_ids(model_path, prompt, 3, runs=2, warmup=0, n_threads=1)
    for key in ("prefill_tps", "decode_tps"):
        assert math.isfinite(out[key]) and out[key] > 0
    assert len(out["prefill_tps_runs"]) == 2 and out["config"]["logits_all"] is False


def test_the_audit_gives_each_tokens_gap_below_llamas_top1(model_path, tmp_path, monkeypatch):
    from evalbot.reference import llama as reference_llama

    monkeypatch.setenv("EVALBOT_CACHE", str(tmp_path))  # no cached answer from an earlier run
    prompt = [9707, 11, 1879, 0, 576, 374, 264]
    (first,) = reference_llama.audit_sequences(model_path, [{"key": "k", "prompt": prompt, "tokens": [0]}])
    top = first["argmax"][0]
    unlikely = 151000 if top != 151000 else 150000
    (got,) = reference_llama.audit_sequences(
        model_path, [{"key": "k", "prompt": prompt, "tokens": [top, unlikely, top]}]
    )
    assert got["gap"][0] == 0.0 and got["argmax"][0] == top  # the top-1 itself: no gap
    assert got["gap"][1] >= got["margin"][1] and got["gap"][1] > 1.0  # an unlikely token: far below
    assert len(got["gap"]) == len(got["margin"]) == 3


@needs_llama
def test_llama_cpps_tokenizer_reads_the_prompt_corpus_as_the_engine_does(model_path):
    """The reference tokenizes the text it scores with llama.cpp's own tokenizer (no engine's is at hand).
    On every file of the prompt corpus it gives this repository's engine's ids: the switch from the
    engine's tokenizer changed no accuracy text."""
    from engine.gguf import GGUFFile
    from engine.tokenizer import Tokenizer
    from evalbot.reference.llama import load_tokenizer

    ours = load_tokenizer(model_path)
    gf = GGUFFile(model_path)
    try:
        engine = Tokenizer.from_metadata(gf.metadata)
    finally:
        gf.close()
    files = sorted(p for p in resources.files("evalbot").joinpath("data/prompts/v1").iterdir() if p.is_file())
    assert len(files) >= 10
    for f in files:
        text = f.read_text(encoding="utf-8")
        assert ours.encode(text) == engine.encode(text), f.name
    assert ours.decode(ours.encode("def fib(n):\n    return n")) == "def fib(n):\n    return n"
    assert ours.eot_ids and all(t in range(151936) for t in ours.eot_ids)
