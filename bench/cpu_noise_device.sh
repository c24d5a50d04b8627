#!/usr/bin/env bash
# #40's CPU part on the device's Intel CPU: what a slow decode step on one vCPU is made of, alone and next
# to other tenants, with and without transparent huge pages under the weights (`bench/decode_drift.py`
# traces, `bench/drift_analysis.py` summary). Run from the repo root through the device tool; results to $OUT.
#
#   SECONDS_EACH (90) CTX (512) TOKENS (200: decode steps a prompt) CPU_SHAPE (qwen2.5-0.5b: the real shape, random fp32 weights)
set -uo pipefail
export PYTHONUNBUFFERED=1
S=${SECONDS_EACH:-90}
CTX=${CTX:-512}
SHAPE=${CPU_SHAPE:-qwen2.5-0.5b}
python3 -m pip install -q --no-index --no-deps --no-cache-dir .whl/*.whl 2>&1 | tail -2 \
  || python3 -m pip install -q --no-index --no-deps --no-cache-dir --break-system-packages .whl/*.whl 2>&1 | tail -2
lscpu > "$OUT/lscpu.txt"
{ cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag; uname -a; nproc
  grep MHz /proc/cpuinfo | sort | uniq -c; } > "$OUT/box.txt" 2>&1
trace() { # name cpu env...
  local name=$1 cpu=$2; shift 2
  env "$@" taskset -c "$cpu" python3 bench/decode_drift.py --shape "$SHAPE" --ctx "$CTX" --tokens "${TOKENS:-200}" \
    --seconds "$S" --label "$name" --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1
}
echo "phase 1: one trace at a time, the other 15 vCPUs idle"
trace alone_base 2 X=1
trace alone_thp 2 THP_MEM_ALLOC_ENABLE=1
echo "phase 2: four at once on vCPUs 2, 4, 6, 8 (tenants on one host)"
trace four_base_a 2 X=1 & trace four_thp_a 4 THP_MEM_ALLOC_ENABLE=1 &
trace four_base_b 6 X=1 & trace four_thp_b 8 THP_MEM_ALLOC_ENABLE=1 &
wait
python3 bench/drift_analysis.py "$OUT"/alone_*.json --out "$OUT/alone_summary.json" | tee "$OUT/alone_summary.md"
python3 bench/drift_analysis.py "$OUT"/four_*.json --out "$OUT/four_summary.json" | tee "$OUT/four_summary.md"
tail -n 14 "$OUT"/*.log
