#!/usr/bin/env bash
# The contest scenario (tests/evalbot/test_bot_scenario.py) N times in a row beside a CPU-heavy neighbour:
# a Python process that spins for ON seconds out of every PERIOD (default 0.2 of 1.0: a fifth of a core on
# average, a whole core in its bursts), as a background job on a shared 2-core box does.
#   bash bench/loaded_scenario.sh OUT_DIR [RUNS] [ON] [PERIOD]
# Each run's pytest output goes to OUT_DIR/runN.txt and one line per run to OUT_DIR/log.txt.
set -uo pipefail
out=${1:?OUT_DIR}; runs=${2:-5}; on=${3:-0.2}; period=${4:-1.0}
root=$(git rev-parse --show-toplevel); py="$root/.venv/bin/python"
mkdir -p "$out"
"$py" -c "
import time
on, period = $on, $period
while True:
    t = time.monotonic()
    while time.monotonic() - t < on:
        pass
    time.sleep(max(period - on, 0))
" &
hog=$!
trap 'kill $hog 2>/dev/null' EXIT
echo "$(date -u +%FT%TZ) start: HEAD $(git -C "$root" rev-parse --short HEAD), neighbour spins $on s of every $period s (pid $hog)" | tee -a "$out/log.txt"
passed=0
for i in $(seq 1 "$runs"); do
  t0=$(date +%s)
  (cd "$root" && "$py" -m pytest -q -p no:xdist -p no:cacheprovider tests/evalbot/test_bot_scenario.py) > "$out/run$i.txt" 2>&1
  rc=$?; [ $rc -eq 0 ] && passed=$((passed + 1))
  echo "$(date -u +%FT%TZ) run $i: exit $rc in $(( $(date +%s) - t0 )) s: $(tail -1 "$out/run$i.txt")" | tee -a "$out/log.txt"
done
echo "$(date -u +%FT%TZ) $passed of $runs passed" | tee -a "$out/log.txt"
