"""The synthetic change of a known size for the GPU calibration (`bench/calibrate_gpu_device.sh`
MODE=synthetic): main's decode step gets K extra no-op kernels (in-place adds of 0 to the logits, so the
tokens stay bit-identical), and the PR is main without them: a speedup of K small kernels a step.

    python bench/synthetic_noop.py engine/model.py 24
"""

from __future__ import annotations

import sys
from pathlib import Path

DECODE_RETURN = "        return self.logits(x)[:, 0]\n"


def add_noops(source: str, k: int) -> str:
    """The model source with k no-op kernels at the end of `Transformer.decode`; ValueError if the decode
    step's return is not where it was (one line, `return self.logits(x)[:, 0]`)."""
    if source.count(DECODE_RETURN) != 1:
        raise ValueError("the decode step's return moved: update bench/synthetic_noop.py")
    noops = (
        "        out = self.logits(x)[:, 0]\n"
        f"        for _ in range({int(k)}):  # synthetic: no-op kernels\n"
        "            out.add_(0.0)\n"
        "        return out\n"
    )
    return source.replace(DECODE_RETURN, noops)


if __name__ == "__main__":
    path = Path(sys.argv[1])
    path.write_text(add_noops(path.read_text(), int(sys.argv[2])))
