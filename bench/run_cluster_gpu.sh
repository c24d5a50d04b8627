#!/usr/bin/env bash
# The cluster decode kernel on the GPU box, in one call: build, parity tests, kernel benchmark, and
# (PHASES=... e2e) end-to-end decode. Usage: OUT=/some/dir PHASES="build test bench e2e" bash bench/run_cluster_gpu.sh
# Each phase's time limit: BUILD_T, TEST_T, BENCH_T, E2E_T (seconds); each phase prints its wall time.
set -uo pipefail
OUT=${OUT:-out}
PHASES=${PHASES:-"build test bench"}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
has() { [[ " $PHASES " == *" $1 "* ]]; }
t0=$(date +%s)
stamp() { echo "[$1: $(( $(date +%s) - t0 )) s since the start]"; }
if has build; then
  start=$(date +%s)
  timeout ${BUILD_T:-400} python3 - <<'PY' 2>&1 | tee "$OUT/build.txt"
import time, torch
t0 = time.time()
from kernels import cluster_decode as cd
dev = torch.device("cuda")
print("unavailable:", cd.unavailable_reason(dev), f"({time.time() - t0:.1f} s)")
for d, configs in cd.CONFIGS.items():
    for s, g in configs:
        print("d", d, "stages", s, "groups", g, "smem", cd._module().smem_bytes(d, s, g), "max active clusters", cd.max_active_clusters(dev, torch.bfloat16, d, s, g))
q = torch.randn(1, 32, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
n = torch.full((1,), 4096, dtype=torch.int32, device="cuda")
out = cd.flash_decode(q, k, k, n, 128 ** -0.5)
torch.cuda.synchronize()
from kernels.reference import decode_attention
ref = decode_attention(q.float(), k.float(), k.float(), n, 128 ** -0.5)
print("smoke rel err", ((out.float() - ref).norm() / ref.norm()).item())
PY
  echo "build phase: $(( $(date +%s) - start )) s"
fi
if has test; then
  timeout ${TEST_T:-420} python3 -m pytest -q -p no:cacheprovider -m gpu --timeout 120 -rf \
    tests/kernels/test_cluster_decode.py 2>&1 | tail -40 | tee "$OUT/gpu_tests.txt"
  stamp tests
fi
if has alltests; then
  timeout 500 python3 -m pytest -q -p no:cacheprovider -m gpu --timeout 180 -rf \
    tests/kernels/ tests/engine/test_gpu.py 2>&1 | tail -40 | tee "$OUT/gpu_tests_all.txt"
fi
if has bench; then
  timeout ${BENCH_T:-400} python3 bench/flash_decode.py --batch 1 8 ${BENCH_ARGS:-} --ops-choice --out "$OUT/flash_decode.json" \
    > "$OUT/flash_decode.md" 2> "$OUT/flash_decode.err"
  tail -5 "$OUT/flash_decode.err"; cat "$OUT/flash_decode.md"
  stamp bench
fi
if has e2e; then
  timeout ${E2E_T:-400} python3 bench/e2e_decode.py --shape qwen3-8b --ctx 4096 --gen 128 --rounds 5 --modes "compiled + cuda-graph" \
    --decode-kernels triton-flash-decode cuda-cluster-decode auto ${E2E_ARGS:-} --out "$OUT/e2e_decode.json" 2>&1 | tail -30 | tee "$OUT/e2e_decode.md"
fi
stamp done
