#!/usr/bin/env bash
# A/A runs of the cpu profile at several settings, alternated run by run so that the box's drift over
# the evening falls on every setting alike (#40, the CPU part). Nothing else may run on the box meanwhile.
#   bash bench/cpu_slice_compare.sh OUT_DIR ROUNDS SETTING... (e.g. 2 0.5 0.25, or 2 0.25 0.25:pin)
# A setting is a slice length, with `:pin` for both engines pinned to one CPU (measurement.pin).
# Each run: `evalbot calibrate --runs 1 --no-spec --no-accuracy` on this checkout's HEAD with the repository's
# rules, measurement.slice_s (and pin) replaced; then the MDE of each context per run, and their medians per
# setting.
set -uo pipefail
out=$(realpath -m "${1:?OUT_DIR}"); rounds=${2:?ROUNDS}; shift 2
root=$(git rev-parse --show-toplevel); bot="$root/.venv/bin/evalbot"
mkdir -p "$out"; tmp=$(mktemp -d /tmp/cpu-slice.XXXX)
for s in "$@"; do
  cp -r "$root/rules" "$tmp/rules-$s"
  sed -i "s/^    slice_s: [0-9.]*/    slice_s: ${s%:pin}/" "$tmp/rules-$s/profiles.yaml"
  grep -q "slice_s: ${s%:pin}\$" "$tmp/rules-$s/profiles.yaml" || { echo "cannot set slice_s ${s%:pin}"; exit 1; }
  sed -i "/^cpu:/,\$ s/^    pin: .*$//" "$tmp/rules-$s/profiles.yaml"
  [[ "$s" == *:pin ]] && sed -i "/^cpu:/,\$ s/^    threads: 1$/    threads: 1\n    pin: true/" "$tmp/rules-$s/profiles.yaml"
  [[ "$s" == *:pin ]] && { grep -q "^    pin: true" "$tmp/rules-$s/profiles.yaml" || { echo "cannot pin"; exit 1; }; }
done
for i in $(seq 1 "$rounds"); do
  for s in "$@"; do
    t0=$(date +%s)
    (cd "$tmp" && "$bot" calibrate --repo "$root" --rev HEAD --runs 1 --profile cpu --rules "$tmp/rules-$s" \
      --no-spec --no-accuracy --box "$(hostname)" --state "$tmp/aa.db" --work-dir "$tmp/work" --json \
      > "$out/s${s}_$i.json" 2> "$out/s${s}_$i.err")
    rc=$?
    echo "$(date -u +%H:%M:%S) slice $s run $i: exit $rc in $(( $(date +%s) - t0 )) s" | tee -a "$out/log.txt"
  done
done
python3 - "$out" "$@" <<'PY'
import json, statistics, sys
from pathlib import Path
out, slices = Path(sys.argv[1]), sys.argv[2:]
print("| slice_s | run | ctx 128 ratio, MDE | ctx 512 ratio, MDE | false verdicts |")
print("|--:|--:|---|---|--:|")
meds = {}
for s in slices:
    for f in sorted(out.glob(f"s{s}_*.json")):
        try:
            d = json.loads(f.read_text())
        except ValueError:
            print(f"| {s} | {f.stem} | no result | | |")
            continue
        rows = {r["context"]: r for r in d["rows"]}
        cells = [f"{r['details']['ratios'][0]:.4f}x, {100 * r['mde']:.2f}%" for _, r in sorted(rows.items())]
        for c, r in rows.items():
            meds.setdefault((s, c), []).append(r["mde"])
        fp = sum(r["details"]["false_positives"] for r in rows.values())
        print(f"| {s} | {f.stem.split('_')[1]} | {' | '.join(cells)} | {fp} |")
for (s, c), v in sorted(meds.items()):
    print(f"slice {s} ctx {c}: median MDE {100 * statistics.median(v):.2f}% over {len(v)} runs")
PY
