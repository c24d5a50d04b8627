#!/usr/bin/env bash
# bench/gpu_process_offsets.py as run through the device tool from the repo root (one call): the wheels
# the device image lacks come from .whl/ (gguf, cryptography, cffi, pycparser, unidiff), results go to $OUT.
#   ARGS (env): the bench's arguments beyond --out (default: qwen3-8b at 4k and 16k, 4 processes a condition)
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu \
  --format=csv,noheader -lms 1000 > "$OUT/gpu_trace.csv" 2>/dev/null &
SAMPLER=$!
# shellcheck disable=SC2086
python3 bench/gpu_process_offsets.py ${ARGS:---shape qwen3-8b --ctx 4096 16384 --processes 4 --pairs 2 --budget-s 500} \
  --out "$OUT/offsets.json" 2> >(tee "$OUT/offsets.log" >&2)
echo "bench exit $?"
kill $SAMPLER 2>/dev/null
