"""Launches each decode kernel a few times at one shape, for Nsight Compute to profile (--clock-control none).

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats -k regex:'decode_kernel|_partial' \
        python3 bench/cluster_ncu.py --batch 8 --ctx 16384
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import cluster_decode as cd
from kernels import flash_decode as fd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--heads", default="32,8,128", help="Hq,Hkv,D")
    ap.add_argument("--splits", type=int, default=0, help="cluster kernel's CTAs a cluster (0: heuristic)")
    args = ap.parse_args()
    hq, hkv, d = map(int, args.heads.split(","))
    q = torch.randn(args.batch, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(args.batch, hkv, args.ctx, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    n = torch.full((args.batch,), args.ctx, dtype=torch.int32, device="cuda")
    splits = args.splits or None
    for _ in range(3):
        for stages, groups in cd.CONFIGS[d]:
            cd.flash_decode(q, k, v, n, d**-0.5, num_splits=splits, stages=stages, groups=groups)
        cd.flash_decode(q, k, v, n, d**-0.5, num_splits=splits, probe=1)
        fd.flash_decode(q, k, v, n, d**-0.5)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
