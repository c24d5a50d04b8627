#!/usr/bin/env bash
# #36 part 5 on one GPU, in one device call: what the idle probe sees (bench/gpu_idle_probe.py), the real-CUDA
# red-team tests (tests/evalbot/test_gpu_idle_cuda.py), then A/A evaluations of the gpu profile's two-part
# clock at 4k and 16k through `evalbot calibrate` (bench/calibrate_gpu_device.sh), the probe in every pair.
# Usage (device tool, .whl carried): OUT=... RUNS=1 BUDGET=330 bash bench/gpu_freeze_device.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}
mkdir -p "$OUT"
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv
timeout 150 python3 bench/gpu_idle_probe.py --repeats "${REPEATS:-3}" --out "$OUT/gpu_idle_probe.json" 2>&1
python3 -m pip install -q --no-index --no-deps --no-cache-dir .whl/*.whl 2>&1 | tail -1
timeout 240 python3 -m pytest -q -p no:cacheprovider -s tests/evalbot/test_gpu_idle_cuda.py > "$OUT/cuda_tests.txt" 2>&1
tail -12 "$OUT/cuda_tests.txt"
echo "probe and tests took $(( $(date +%s) - T0 )) s"
[ "${RUNS:-1}" -gt 0 ] && MODE=calibrate SHAPE=${SHAPE:-qwen3-8b} CTXS="4096 16384" PAIRS_PER_BLOCK=2 MIN_BLOCKS=4 MAX_PAIRS=8 \
  RUNS=${RUNS:-1} DECODE=128 STREAM=ends WARM=1 BUDGET=${BUDGET:-330} OUT=$OUT bash bench/calibrate_gpu_device.sh
echo "call took $(( $(date +%s) - T0 )) s"
