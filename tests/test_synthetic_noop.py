"""The GPU calibration's synthetic change must keep applying to main and keep the tokens bit-identical,
or `bench/calibrate_gpu_device.sh MODE=synthetic` measures an A/A (it did once, on 2026-12-06, after the
decode step's next line had changed)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from synthetic_noop import add_noops  # noqa: E402

_DECODE = """
import sys
sys.path.insert(0, sys.argv[1])
import torch
from engine.generate import Session, load_random
lm = load_random("qwen3-tiny", "cpu", max_pos=64)
t = lm.transformer
s = Session(lm, 64)
s.forward([1, 2, 3])
logits = t.decode(torch.tensor([[7]]), torch.tensor([3]), s.cache)
torch.save(logits, sys.argv[2])
"""


def test_the_synthetic_change_applies_and_keeps_the_logits_bit_identical(tmp_path):
    model = (ROOT / "engine" / "model.py").read_text()
    patched = add_noops(model, 24)
    assert patched.count("out.add_(0.0)") == 1 and "range(24)" in patched
    outs = []
    for name, source in (("main", model), ("synthetic", patched)):
        tree = tmp_path / name
        shutil.copytree(ROOT / "engine", tree / "engine")
        shutil.copytree(ROOT / "kernels", tree / "kernels")
        (tree / "engine" / "model.py").write_text(source)
        out = tmp_path / f"{name}.pt"
        proc = subprocess.run(
            [sys.executable, "-c", _DECODE, str(tree), str(out)], capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(out)
    import torch

    a, b = (torch.load(p) for p in outs)
    assert torch.equal(a, b)


def test_a_moved_decode_return_is_refused():
    with pytest.raises(ValueError, match="moved"):
        add_noops("def decode(self):\n    return 1\n", 3)
