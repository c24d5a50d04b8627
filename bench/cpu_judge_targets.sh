#!/usr/bin/env bash
# The cpu judge's targets on this box, one run after another (nothing else may run on the box meanwhile):
#   bash bench/cpu_judge_targets.sh OUT_DIR BOX [AA_RUNS] [SPEEDUP_RUNS] [SLOWDOWN_RUNS] [BREAKDOWN_BLOCKS] [GAIN3_RUNS]
# - first, with BREAKDOWN_BLOCKS > 0, bench/variance_breakdown.py on an A/A run of that many blocks;
# - AA_RUNS served A/A runs of this checkout's HEAD (`evalbot calibrate --runs 1`, no spec, no accuracy:
#   the A/B and the decode audit), each its own JSON and log;
# - SPEEDUP_RUNS evaluations of demo/cpu-fewer-dispatches.patch (a bit-identical decode speedup) against
#   main, the first with every gate (spec and accuracy included: the full evaluation's time), the rest A/B
#   and decode audit only;
# - SLOWDOWN_RUNS evaluations of demo/cpu-slow-long-context.patch (slower past 256 positions only);
# - GAIN3_RUNS evaluations of a PR that takes demo/cpu-redundant-logits.patch out of a main that carries it
#   (16,384 vocabulary rows scored again each decode step, ~3% more bytes read): a genuine ~3% decode
#   speedup with identical output (the PR does less of the same work), A/B and decode audit only. (The bot
#   judges the PR merged into main, so the PR must be the revert: this checkout as a head against the
#   patched branch as a base would be judged as the base merged with itself.)
# With RULES=DIR in the environment, every run reads that rules directory instead of the repository's.
# Then `python bench/cpu_judge_summary.py OUT_DIR` prints the tables docs/benchmarks.md holds.
set -uo pipefail
out=${1:?OUT_DIR}; box=${2:?BOX}; aa=${3:-10}; fast=${4:-3}; slow=${5:-1}; blocks=${6:-0}; gain3=${7:-0}
root=$(git rev-parse --show-toplevel); bot="$root/.venv/bin/evalbot"
mkdir -p "$out"; tmp=$(mktemp -d /tmp/cpu-judge.XXXX)
rules=(); [ -n "${RULES:-}" ] && rules=(--rules "$RULES")
stamp() { date -u +%Y-%m-%dT%H:%M:%SZ; }
echo "$(stamp) start: HEAD $(git -C "$root" rev-parse --short HEAD), box $box, $(nproc) cores, rules ${RULES:-rules/}" | tee -a "$out/log.txt"
if [ "$blocks" -gt 0 ]; then
  t0=$(date +%s)
  "$root/.venv/bin/python" "$root/bench/variance_breakdown.py" --blocks "$blocks" --out "$out/breakdown.json" \
    > "$out/breakdown.txt" 2> "$out/breakdown.err"
  echo "$(stamp) breakdown: exit $? in $(( $(date +%s) - t0 )) s" | tee -a "$out/log.txt"
fi
for i in $(seq 1 "$aa"); do
  t0=$(date +%s)
  "$bot" calibrate --repo "$root" --rev HEAD --runs 1 --profile cpu "${rules[@]}" --no-spec --no-accuracy --box "$box" \
    --state "$tmp/aa.db" --work-dir "$tmp/work" --json > "$out/aa$i.json" 2> "$out/aa$i.err"
  rc=$?  # before any command substitution resets $?
  echo "$(stamp) aa $i: exit $rc in $(( $(date +%s) - t0 )) s: $(tail -1 "$out/aa$i.err")" | tee -a "$out/log.txt"
done
judge() {  # name patch first last [reversed: main carries the patch and the PR takes it out again]
  if [ ! -d "$tmp/$1-repo" ]; then
    bash "$root/scripts/make_demo_repo.sh" "$tmp/$1-repo" "$root/demo/$2" > /dev/null
    if [ "${5:-}" = reversed ]; then  # the bot judges the PR merged into main: the PR must be the revert
      git -C "$tmp/$1-repo" branch -q -f main demo-head
      git -C "$tmp/$1-repo" -c user.name=contributor -c user.email=c@example.invalid revert --no-edit demo-head > /dev/null &&
      git -C "$tmp/$1-repo" -c user.name=contributor -c user.email=c@example.invalid commit -q --amend \
        -m "engine: take out the unused work of $2 (the same output, less read per decode step)" \
        || { echo "$(stamp) $1: could not make the revert PR" | tee -a "$out/log.txt"; return 1; }
    fi
  fi
  local base=main head=demo-head
  for i in $(seq "$3" "$4"); do
    t0=$(date +%s); gates=()
    [ "$i" -gt 1 ] || [ "$1" != speedup ] && gates=(--no-spec --no-accuracy)  # the first speedup run: every gate
    "$bot" evaluate --repo "$tmp/$1-repo" --base "$base" --head "$head" --profile cpu "${rules[@]}" --work-dir "$tmp/work" \
      "${gates[@]}" --out "$out/$1$i" > "$out/$1$i.log" 2>&1
    rc=$?
    echo "$(stamp) $1 $i: exit $rc in $(( $(date +%s) - t0 )) s" | tee -a "$out/log.txt"
  done
}
# one speedup run with every gate, the slowdown, then the rest of the speedup runs
[ "$fast" -gt 0 ] && judge speedup cpu-fewer-dispatches.patch 1 1
[ "$slow" -gt 0 ] && judge slowdown cpu-slow-long-context.patch 1 "$slow"
[ "$fast" -gt 1 ] && judge speedup cpu-fewer-dispatches.patch 2 "$fast"
[ "$gain3" -gt 0 ] && judge gain3 cpu-redundant-logits.patch 1 "$gain3" reversed
rm -rf "$tmp"
echo "$(stamp) done" | tee -a "$out/log.txt"
