"""`python -m engine generate|bench|score` in real subprocesses: one JSON record on stdout each."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from evalbot.reference.registry import model_sha256

ENVELOPE = {"schema", "command", "engine", "model_sha256", "device", "config", "timings", "counts"}


def run(*args, check=True):
    proc = subprocess.run(
        [sys.executable, "-m", "engine", *args], capture_output=True, text=True, timeout=300, errors="replace"
    )
    if check:
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.strip().splitlines()
        assert len(lines) == 1, f"stdout must hold exactly one JSON record, got {proc.stdout!r}"
        return json.loads(lines[0]), proc.stderr
    return proc


def test_generate(synthetic_qwen3):
    rec, err = run(
        "generate", "--model", str(synthetic_qwen3), "--prompt", "def merge", "--max-new", "12", "--no-stop"
    )
    assert rec.keys() >= ENVELOPE and rec["schema"] == "evalbot.engine.generate/1"
    assert rec["model_sha256"] == model_sha256(synthetic_qwen3)
    assert rec["counts"]["new_tokens"] == 12 == len(rec["token_ids"])
    assert rec["config"]["temperature"] == 0.0 and rec["config"]["dtype"] == "float32"
    assert rec["text"] and err.strip()  # the text is streamed to stderr; stdout holds only the record


def test_sampled_generation_is_seeded(synthetic_qwen3):
    args = [
        "generate",
        "--model",
        str(synthetic_qwen3),
        "--prompt",
        "The river",
        "--max-new",
        "10",
        "--no-stop",
        "--temperature",
        "0.9",
        "--top-p",
        "0.95",
        "--seed",
        "5",
        "--quiet",
    ]
    assert run(*args)[0]["token_ids"] == run(*args)[0]["token_ids"]


def test_bench(synthetic_qwen3):
    rec, _ = run("bench", "--model", str(synthetic_qwen3), "--ctx", "100", "--gen", "8", "--runs", "2")
    assert rec["counts"] == {"ctx": 100, "gen": 8, "runs": 2}
    for key in ("prefill_tps", "decode_tps"):
        assert math.isfinite(rec[key]) and rec[key] > 0
        assert len(rec[key + "_runs"]) == 2
    assert rec["config"]["ctx"] == 100 and rec["config"]["decode_attention"]["backend"] == "torch-reference"


def test_score(synthetic_qwen3, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("Rivers do not run straight for long. A small bend makes the water flow faster. " * 4)
    out = tmp_path / "s.npy"
    rec, _ = run(
        "score",
        "--model",
        str(synthetic_qwen3),
        "--text-file",
        str(text),
        "--positions",
        "30",
        "--out",
        str(out),
    )
    arr = np.load(out)
    assert arr.shape == (30, 384) and arr.dtype == np.float32
    np.testing.assert_allclose(np.exp(arr).sum(-1), 1.0, rtol=1e-4)
    assert rec["argmax"] == arr.argmax(-1).tolist()
    ids = rec["token_ids"]
    np.testing.assert_allclose(rec["nll"], -arr[np.arange(30), ids[1:]], rtol=1e-5)
    assert json.loads((tmp_path / "s.npy.json").read_text()) == rec


def test_score_needs_enough_tokens(synthetic_qwen3, tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("too short")
    proc = run(
        "score",
        "--model",
        str(synthetic_qwen3),
        "--text-file",
        str(text),
        "--positions",
        "50",
        "--out",
        str(tmp_path / "x.npy"),
        check=False,
    )
    assert proc.returncode == 2 and "needs 51" in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize("content,needle", [(b"NOPE" + b"\0" * 64, "not a GGUF file"), (b"GG", "too short")])
def test_bad_model_file_is_a_clear_error(tmp_path, content, needle):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    proc = run("bench", "--model", str(bad), "--ctx", "8", check=False)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr


def test_unknown_model_name():
    proc = run("bench", "--model", "no-such-model", "--ctx", "8", check=False)
    assert (
        proc.returncode == 2
        and "no such model file 'no-such-model'" in proc.stderr
        and "registry fetch" in proc.stderr
    )
