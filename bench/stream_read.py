"""A compute-free Triton read of a K/V pair: the ceiling for any kernel that reads them once per call.

Imported by ``bench/flash_decode.py --ceiling`` after it has chosen compiled or interpreted Triton.
"""

import triton
import triton.language as tl


@triton.jit
def stream_read(K, V, Out, numel, per_prog, BLOCK: tl.constexpr):
    """Program p sums K and V over elements [p * per_prog, (p + 1) * per_prog) (the sum keeps the loads)."""
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    start = pid.to(tl.int64) * per_prog
    for i in range(0, per_prog, BLOCK):
        idx = start + i + offs
        ok = idx < numel
        acc += tl.load(K + idx, mask=ok, other=0.0).to(tl.float32)
        acc += tl.load(V + idx, mask=ok, other=0.0).to(tl.float32)
    tl.store(Out + pid, tl.sum(acc))
