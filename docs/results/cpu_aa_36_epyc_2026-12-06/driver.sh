#!/usr/bin/env bash
# #36: A/A runs of the cpu profile, the new harness and the old one alternating (nothing else on the box)
out=/work/main/docs/results/cpu_aa_36_epyc_2026-12-06
mkdir -p "$out"
i=0
for tag in new old new old new old new new; do
  i=$((i + 1))
  root=/tmp/aa-$tag
  (cd "$root" && PYTHONPATH="$root" bash bench/cpu_judge_targets.sh "$out/$i-$tag" epyc-2core 1 0 0 0) >> "$out/driver.log" 2>&1
  echo "$(date -u +%H:%M:%S) run $i ($tag, $(git -C "$root" rev-parse --short HEAD)) done" >> "$out/driver.log"
done
