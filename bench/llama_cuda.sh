#!/usr/bin/env bash
# llama.cpp built with CUDA on the GPU box vs our engine, decode tok/s at ctx 4k, batch 1 (#28 part 3),
# in one call of the device tool (at most 10 minutes; bare machine, no network).
#
#   OUT=$OUT bash bench/llama_cuda.sh        (carry .whl and .llama; see the end of this header)
#
# Phases, each timed and bounded so that a partial run still reports:
#   (a) nvidia-smi; (b) unpack .llama/llama.cpp-src.tar.xz (llama.cpp as vendored in llama-cpp-python
#   0.3.36, repacked to what a CUDA llama-bench needs), configure, build only llama-bench (its timeout
#   is what the budget leaves after reserving the benches); (c) meanwhile, bench/gguf_random.py writes a
#   random-weight GGUF of the shape (bf16); (d) llama-bench on it: all layers on the GPU, flash
#   attention on, decode GEN tokens at depth CTX (-d), prefill CTX, REPS repetitions, -o json;
#   (e) our engine's `engine bench` on random weights of the same shape; (f) the ratio.
# Results land flat in $OUT (8 files): run.log, llama_build.json, llama_build.log, gguf.json,
# llama_bench.json, engine_bench.json, llama_vs_engine.json, llama_vs_engine.md.
# A failed or timed-out build still runs (e) and reports the build's outcome and seconds.
# Knobs (env): SHAPE CTX GEN REPS DTYPE JOBS BUDGET (s, whole script) RESERVE (s kept for d-f)
#   DEVICE (cuda; cpu for a local dry run) LLAMA_CUDA (ON; OFF builds the CPU backend only)
#   LLAMA_BENCH_BIN (skip the build and use this binary)
set -uo pipefail
T0=$(date +%s.%N)
OUT=${OUT:-out}
SHAPE=${SHAPE:-qwen3-8b}
CTX=${CTX:-4096}
GEN=${GEN:-128}
REPS=${REPS:-3}
DTYPE=${DTYPE:-bf16}
JOBS=${JOBS:-$(nproc)}
BUDGET=${BUDGET:-560}
RESERVE=${RESERVE:-180}
DEVICE=${DEVICE:-cuda}
LLAMA_CUDA=${LLAMA_CUDA:-ON}
TARBALL=${TARBALL:-.llama/llama.cpp-src.tar.xz}
LLAMA_COMMIT=0c1e570  # vendor/llama.cpp of llama-cpp-python 0.3.36: 0c1e57098bba43ac29e6e3b677cdceebdd22334f
WORK=${WORK:-/tmp/llama_cuda}
mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/run.log"
: >"$LOG"
export PYTHONUNBUFFERED=1

el() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
left() { awk -v a="$T0" -v b="$(date +%s.%N)" -v t="$BUDGET" 'BEGIN { printf "%d", t - (b - a) }'; }
say() { echo "[$(el "$T0") s] $*" | tee -a "$LOG"; }

# (a) the card
say "phase a: GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv 2>&1 | tee -a "$LOG"
say "cpus $(nproc), mem $(free -g | awk '/Mem:/ {print $2}') GiB; /tmp free $(df -BG --output=avail /tmp | tail -1)"

# the carried wheels (gguf for the writer and our engine)
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >>"$LOG" 2>&1 && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -c 'import gguf, torch; print("gguf", gguf.__file__, "torch", torch.__version__)' 2>&1 | tee -a "$LOG"

# where a 16 GB file fits
GGUF_DIR=""
for d in /tmp /dev/shm "$WORK"; do
  avail=$(df -B1G --output=avail "$d" 2>/dev/null | tail -1 | tr -d ' ')
  if [ -n "$avail" ] && [ "$avail" -ge 24 ]; then GGUF_DIR=$d; break; fi
done
GGUF_DIR=${GGUF_DIR:-/tmp}
GGUF="$GGUF_DIR/random-$SHAPE-$DTYPE.gguf"

# (c) in the background from the start: the GGUF (GPU draws, one core writes)
say "phase c (background): writing $GGUF"
T_GGUF=$(date +%s.%N)
( timeout $((BUDGET - 160)) python3 bench/gguf_random.py "$GGUF" --shape "$SHAPE" --dtype "$DTYPE" \
    >"$OUT/gguf.json" 2>"$WORK/gguf.err"; echo $? >"$WORK/gguf.rc"; date +%s.%N >"$WORK/gguf.t1" ) &
GGUF_PID=$!

# (b) the build
BUILD_STATUS=skipped; BUILD_S=0; CONFIGURE_S=0; UNPACK_S=0; BUILD_TIMEOUT=0; BENCH_BIN=""
NVCC=$(command -v nvcc || find /usr/local/cuda*/bin -maxdepth 1 -name nvcc 2>/dev/null | sort -V | tail -1)
# cmake and ninja: on PATH, else the pip packages' binaries, else a carried cmake wheel (.llama/cmake-*.whl)
CMAKE=$(command -v cmake || python3 -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))' 2>/dev/null)
if [ -z "$CMAKE" ] && ls .llama/cmake-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/cmake .llama/cmake-*.whl >>"$LOG" 2>&1
  CMAKE=$(ls /tmp/cmake/cmake/data/bin/cmake 2>/dev/null)
fi
[ -n "$CMAKE" ] && [ ! -x "$CMAKE" ] && CMAKE=""
NINJA=$(command -v ninja || python3 -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))' 2>/dev/null)
GENERATOR="Unix Makefiles"; GEN_ARGS=()
if [ -n "$NINJA" ] && [ -x "$NINJA" ]; then GENERATOR=Ninja; GEN_ARGS=(-DCMAKE_MAKE_PROGRAM="$NINJA"); fi
NVCC_V=$([ -n "$NVCC" ] && "$NVCC" --version | tail -2 | head -1)
CMAKE_V=$([ -n "$CMAKE" ] && "$CMAKE" --version | head -1)
say "phase b: nvcc ${NVCC:-MISSING} (${NVCC_V:-}), cmake ${CMAKE:-MISSING} (${CMAKE_V:-}), generator $GENERATOR, -j $JOBS"
if [ -n "${LLAMA_BENCH_BIN:-}" ]; then
  BENCH_BIN=$LLAMA_BENCH_BIN; BUILD_STATUS=prebuilt
elif [ -z "$CMAKE" ]; then
  BUILD_STATUS="no cmake on the machine"; say "NO CMAKE: cannot build llama.cpp (carry a cmake wheel in .llama/)"
elif [ "$LLAMA_CUDA" = ON ] && [ -z "$NVCC" ]; then
  BUILD_STATUS="no nvcc on the machine"; say "NO NVCC: cannot build llama.cpp with CUDA"
elif [ ! -f "$TARBALL" ]; then
  BUILD_STATUS="no $TARBALL (carry .llama)"; say "MISSING $TARBALL"
else
  t=$(date +%s.%N)
  rm -rf "$WORK/llama.cpp" && tar -xJf "$TARBALL" -C "$WORK"
  UNPACK_S=$(el "$t")
  say "unpacked in $UNPACK_S s: $(head -2 "$WORK/llama.cpp/REPACK.txt" 2>/dev/null | tr '\n' ' ')"
  if [ -n "$NVCC" ]; then
    CUDACXX=$NVCC; PATH="$(dirname "$NVCC"):$PATH"; export CUDACXX PATH
  fi
  t=$(date +%s.%N)
  timeout 120 "$CMAKE" -S "$WORK/llama.cpp" -B "$WORK/build" -G "$GENERATOR" "${GEN_ARGS[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA="$LLAMA_CUDA" -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DGGML_CCACHE=OFF -DLLAMA_BUILD_NUMBER=0 -DLLAMA_BUILD_COMMIT=$LLAMA_COMMIT >"$WORK/build.log" 2>&1
  rc=$?
  CONFIGURE_S=$(el "$t")
  if [ $rc -ne 0 ]; then
    BUILD_STATUS="configure failed (rc $rc)"; say "configure FAILED rc $rc in $CONFIGURE_S s"
  else
    say "configured in $CONFIGURE_S s"
    BUILD_TIMEOUT=$(( $(left) - RESERVE ))
    [ "$BUILD_TIMEOUT" -lt 30 ] && BUILD_TIMEOUT=30
    say "building llama-bench, timeout $BUILD_TIMEOUT s"
    t=$(date +%s.%N)
    timeout "$BUILD_TIMEOUT" "$CMAKE" --build "$WORK/build" --target llama-bench -j "$JOBS" >>"$WORK/build.log" 2>&1
    rc=$?
    BUILD_S=$(el "$t")
    if [ $rc -eq 0 ] && [ -x "$WORK/build/bin/llama-bench" ]; then
      BUILD_STATUS=ok; BENCH_BIN="$WORK/build/bin/llama-bench"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      BUILD_STATUS="timed out (did not fit)"
    else
      BUILD_STATUS="failed (rc $rc)"
    fi
    say "build: $BUILD_STATUS in $BUILD_S s; $(grep -o '^\[[0-9]*/[0-9]*\]' "$WORK/build.log" | tail -1) steps done"
  fi
  # keep the head (configure: toolchain and backends found), the errors and the tail of the log
  { head -60 "$WORK/build.log"; echo "..."; grep -n -i -m 40 'error' "$WORK/build.log"; echo "...";
    tail -60 "$WORK/build.log"; } >"$OUT/llama_build.log" 2>/dev/null
fi
BUILD_STATUS="$BUILD_STATUS" BUILD_S="$BUILD_S" CONFIGURE_S="$CONFIGURE_S" UNPACK_S="$UNPACK_S" \
BUILD_TIMEOUT="$BUILD_TIMEOUT" JOBS="$JOBS" NVCC_V="${NVCC_V:-}" CMAKE_V="${CMAKE_V:-}" GENERATOR="$GENERATOR" \
COMMIT="$LLAMA_COMMIT" LLAMA_CUDA="$LLAMA_CUDA" python3 - "$OUT/llama_build.json" <<'PY'
import json, os, sys
e = os.environ
num = lambda k: float(e[k]) if e.get(k) else None
rec = {
    "status": e["BUILD_STATUS"], "build_s": num("BUILD_S"), "configure_s": num("CONFIGURE_S"),
    "unpack_s": num("UNPACK_S"), "build_timeout_s": num("BUILD_TIMEOUT"), "jobs": int(e["JOBS"]),
    "target": "llama-bench", "cuda": e["LLAMA_CUDA"], "cuda_architectures": "90",
    "nvcc": e["NVCC_V"], "cmake": e["CMAKE_V"], "generator": e["GENERATOR"], "commit": e["COMMIT"],
    "source": "llama.cpp vendored in llama-cpp-python 0.3.36 (sdist), repacked (.llama/llama.cpp-src.tar.xz)",
    "overlapped_with": "bench/gguf_random.py writing the GGUF (GPU draws, one writer thread)",
}
json.dump(rec, open(sys.argv[1], "w"), indent=1)
print(json.dumps(rec))
PY
cat "$OUT/llama_build.json" >>"$LOG"

# (c) done?
say "phase c: waiting for the GGUF writer (its timeout ends it by $((BUDGET - 160)) s)"
wait "$GGUF_PID" 2>/dev/null
tail -5 "$WORK/gguf.err" >>"$LOG" 2>/dev/null
GGUF_RC=$(cat "$WORK/gguf.rc" 2>/dev/null || echo "?")
GGUF_WALL=$(awk -v a="$T_GGUF" -v b="$(cat "$WORK/gguf.t1" 2>/dev/null || echo "$T_GGUF")" 'BEGIN { printf "%.1f", b - a }')
say "gguf: rc $GGUF_RC, wall $GGUF_WALL s (beside the build): $(cat "$OUT/gguf.json" 2>/dev/null)"
stat -c '%n %s bytes' "$GGUF" 2>&1 | tee -a "$LOG"

# (d) llama-bench
LLAMA_CMD="llama-bench -m $GGUF -p $CTX -n $GEN -d 0,$CTX -ngl 99 -fa on -r $REPS -o json -oe md"
if [ -n "$BENCH_BIN" ] && [ "$GGUF_RC" = 0 ]; then
  LB_TIMEOUT=$(( $(left) - 95 ))  # what is left past 95 s for our engine, at most 150 s
  [ "$LB_TIMEOUT" -gt 150 ] && LB_TIMEOUT=150
  if [ "$LB_TIMEOUT" -lt 20 ]; then
    say "phase d: skipped, $(left) s left"
  else
    say "phase d: $LLAMA_CMD (timeout $LB_TIMEOUT s)"
    t=$(date +%s.%N)
    timeout "$LB_TIMEOUT" "$BENCH_BIN" -m "$GGUF" -p "$CTX" -n "$GEN" -d "0,$CTX" -ngl 99 -fa on -r "$REPS" \
      -o json -oe md >"$OUT/llama_bench.json" 2>"$WORK/llama_bench.err"
    rc=$?
    grep -v '^llama_\|^load\|^print_info\|^\.\|^gguf' "$WORK/llama_bench.err" | tail -40 | tee -a "$LOG"
    say "llama-bench rc $rc in $(el "$t") s"
  fi
else
  say "phase d: skipped (build: $BUILD_STATUS; gguf rc $GGUF_RC)"
fi
rm -f "$GGUF"  # free the page cache / tmpfs for our engine

# (e) our engine
ENGINE_CMD="python3 -m engine bench --device $DEVICE --random-weights --shape $SHAPE --ctx $CTX --gen $GEN --runs $REPS"
EN_TIMEOUT=$(( $(left) - 8 ))
if [ "$EN_TIMEOUT" -lt 20 ]; then
  say "phase e: skipped, $(left) s left"
else
  say "phase e: $ENGINE_CMD (timeout $EN_TIMEOUT s)"
  t=$(date +%s.%N)
  # shellcheck disable=SC2086
  timeout "$EN_TIMEOUT" $ENGINE_CMD >"$OUT/engine_bench.json" 2>"$WORK/engine_bench.err"
  rc=$?
  tail -8 "$WORK/engine_bench.err" | tee -a "$LOG"
  say "engine bench rc $rc in $(el "$t") s"
fi

# (f) the ratio
say "phase f: summary"
python3 bench/llama_cuda_summary.py "$OUT" --ctx "$CTX" --gen "$GEN" --llama-cmd "$LLAMA_CMD" \
  --engine-cmd "$ENGINE_CMD" 2>&1 | tee -a "$LOG"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>&1 | tee -a "$LOG"
say "done; files: $(find "$OUT" -type f -printf '%f ')"
