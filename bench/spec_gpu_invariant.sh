#!/usr/bin/env bash
# Lossless bf16 speculation on the GPU box, in one call (#28 part 2): the GPU tests of the row-invariant
# block path, then `engine spec --invariant` (and the plain path for contrast) on random-weight shapes.
# Usage: OUT=/some/dir SHAPES="qwen3-1.7b qwen3-8b" CTX=4096 bash bench/spec_gpu_invariant.sh
set -uo pipefail
OUT=${OUT:-out}
SHAPES=${SHAPES:-"qwen3-1.7b qwen3-8b"}
CONTRAST=${CONTRAST:-"qwen3-1.7b"}  # shapes also run without --invariant
CTX=${CTX:-4096}
GEN=${GEN:-128}
RUNS=${RUNS:-3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
start=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu --timeout 140 -rf \
  tests/kernels/test_block_attention.py tests/engine/test_block_session.py 2>&1 | tail -30 | tee "$OUT/spec_gpu_tests.txt"
echo "tests: $(( $(date +%s) - start )) s" | tee -a "$OUT/spec_gpu_tests.txt"
for shape in $SHAPES; do
  start=$(date +%s)
  timeout 180 python3 -m engine spec --device cuda --random-weights --shape "$shape" --ngram 3 \
    --ctx "$CTX" --gen "$GEN" --runs "$RUNS" --invariant >"$OUT/spec_invariant_${shape}.json" 2>"$OUT/spec_${shape}.log"
  echo "$shape invariant: rc $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/spec_summary.txt"
done
for shape in $CONTRAST; do
  start=$(date +%s)
  timeout 110 python3 -m engine spec --device cuda --random-weights --shape "$shape" --ngram 3 \
    --ctx "$CTX" --gen "$GEN" --runs "$RUNS" >"$OUT/spec_plain_${shape}.json" 2>>"$OUT/spec_${shape}.log"
  echo "$shape plain: rc $? in $(( $(date +%s) - start )) s" | tee -a "$OUT/spec_summary.txt"
done
python3 - "$OUT" <<'PY' | tee -a "$OUT/spec_summary.txt"
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("spec_*.json")):
    try:
        r = json.loads(f.read_text())
    except Exception as e:  # noqa: BLE001
        print(f.name, "unreadable:", e)
        continue
    keys = ("ar_tps", "plain_decode_tps", "spec_tps", "mean_accept", "lossless", "lossless_runs", "first_divergence")
    print(f.name, {k: r.get(k) for k in keys}, "hist", r.get("accept_hist"))
PY
