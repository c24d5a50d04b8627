"""Can this Triton build the cluster exchange a one-kernel split-KV merge needs? Compile-only, no GPU.

A flash-decode that merges its splits without a second kernel would run the 16 splits of one KV head as
a 16-CTA cluster (Hopper; Triton launches ``num_ctas=16`` as a non-portable cluster) and move each
split's partial through distributed shared memory: from "one split per CTA" to "one slice of the head
dim per CTA", then reduce within each CTA. This compiles exactly that exchange, a Gluon
``convert_layout`` of a [16, 128] fp32 tensor between two CTA distributions, for sm_90, and prints what
came out: whether it compiled, and how many cluster instructions (``mapa``, ``shared::cluster``
accesses, ``barrier.cluster``) the PTX holds. Triton 3.6 (the device machine's) fails in its
LLVM lowering; 3.9 compiles it (docs/benchmarks.md).

    python bench/cluster_probe.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

SPLITS, HEAD_DIM = 16, 128


def probe() -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    @gluon.jit
    def exchange(X, Out):
        # one split (row) per CTA: the 16 bases put row i on CTA i
        per_split: gl.constexpr = gl.BlockedLayout(
            [1, 4], [1, 32], [1, 1], [1, 0], [[1, 0], [2, 0], [4, 0], [8, 0]]
        )
        # one 8-wide slice of the head dim per CTA, every split in it (bases count CTA tiles)
        per_slice: gl.constexpr = gl.BlockedLayout(
            [4, 1], [4, 8], [1, 1], [0, 1], [[0, 1], [0, 2], [0, 4], [0, 8]]
        )
        rows = gl.arange(0, 16, layout=gl.SliceLayout(1, per_split))
        cols = gl.arange(0, 128, layout=gl.SliceLayout(0, per_split))
        offs = rows[:, None] * 128 + cols[None, :]
        moved = gl.convert_layout(gl.load(X + offs), per_slice)
        gl.store(Out + gl.convert_layout(offs, per_slice), moved)

    record = {"triton": triton.__version__, "target": "sm_90", "num_ctas": SPLITS}
    src = gluon._runtime.GluonASTSource(
        fn=exchange, signature={"X": "*fp32", "Out": "*fp32"}, constexprs={}, attrs={}
    )
    with tempfile.TemporaryFile(mode="w+") as log:  # MLIR writes its diagnostics to fd 2, not sys.stderr
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            kernel = triton.compile(
                src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1, "num_ctas": SPLITS}
            )
        except Exception as exc:  # the answer we are probing for: record it, do not raise
            failure = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        else:
            failure = None
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        diagnostics = [line.strip() for line in log if "error:" in line]
    if failure is not None:
        return record | {"compiled": False, "error": failure, "diagnostics": diagnostics[:3]}
    ptx = kernel.asm["ptx"]
    counts = {word: ptx.count(word) for word in ("mapa", "shared::cluster", "barrier.cluster")}
    return record | {"compiled": True, "ptx_counts": counts}


if __name__ == "__main__":
    result = probe()
    print(json.dumps(result, indent=1))
    sys.exit(0 if result["compiled"] else 1)
