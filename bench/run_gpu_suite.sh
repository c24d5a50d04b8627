#!/usr/bin/env bash
# Everything that needs the GPU, in one go: GPU tests, then the kernel, end-to-end and speculative benchmarks.
# Usage: OUT=/some/dir bash bench/run_gpu_suite.sh   (results land in $OUT)
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
python3 -m pytest -q -p no:cacheprovider tests/engine/test_gpu.py tests/kernels/test_flash_decode.py -m gpu 2>&1 | tail -15 | tee "$OUT/gpu_tests.txt"
python3 bench/flash_decode.py --batch 1 8 --ceiling --profile --timeline --out "$OUT/flash_decode.json" \
  > "$OUT/flash_decode.md" 2> "$OUT/flash_decode.err"
cat "$OUT/flash_decode.md"
python3 bench/e2e_decode.py --shape qwen3-8b --ctx 4096 --gen 128 --rounds 5 --profile --out "$OUT/e2e_decode.json" 2>&1 | tee "$OUT/e2e_decode.md"
python3 -m engine bench --device cuda --random-weights --shape qwen3-8b --ctx 4096 --gen 64 --runs 3 > "$OUT/bench_qwen3_8b.json" 2> "$OUT/bench_qwen3_8b.err"
tail -3 "$OUT/bench_qwen3_8b.err"
for shape in qwen3-1.7b qwen3-8b; do
  python3 -m engine spec --device cuda --random-weights --shape $shape --ngram 3 --ctx 4096 --gen 128 --runs 3 \
    > "$OUT/spec_ngram_$shape.json" 2> "$OUT/spec_ngram_$shape.err"
  tail -3 "$OUT/spec_ngram_$shape.err"
done
