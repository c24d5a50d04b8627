#!/usr/bin/env bash
# The cpu-both profile (both registry models, a score and a label each, tracks.yaml) judged end to end on
# the real models, one evaluation after another (nothing else may run on the box meanwhile):
#   bash bench/cpu_two_models.sh OUT_DIR [CASES]
# CASES (default "guard labels"), each an `evalbot evaluate --profile cpu-both` of a contest repository whose
# main is this checkout with demo/cpu-redundant-logits.patch (16,384 vocabulary rows scored again at each
# decode step, unused: ~3% more bytes for the 0.5B, ~1.6% for the 1.5B):
# - guard: demo/cpu-one-model-up-other-down.patch on top: the 0.5B skips that work (~3% faster), the 1.5B
#   keeps it and reads three layers' FFN weights again as well (~5% slower). The guard must REJECT it.
# - labels: the revert of the redundant-logits patch (the same output, less work for both models): a PASS
#   with a label per model.
# Each case writes OUT_DIR/<case>/ (report.md, result.json, receipt.json), its log and its time.
set -uo pipefail
out=${1:?OUT_DIR}; cases=${2:-guard labels}
root=$(git rev-parse --show-toplevel); bot="$root/.venv/bin/evalbot"
mkdir -p "$out"; tmp=$(mktemp -d /tmp/cpu-two.XXXX)
stamp() { date -u +%Y-%m-%dT%H:%M:%SZ; }
git_c() { git -C "$1" -c user.name=contributor -c user.email=c@example.invalid "${@:2}"; }
echo "$(stamp) start: HEAD $(git -C "$root" rev-parse --short HEAD), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)" | tee -a "$out/log.txt"
repo="$tmp/repo"
bash "$root/scripts/make_demo_repo.sh" "$repo" "$root/demo/cpu-redundant-logits.patch" > /dev/null
git -C "$repo" branch -q -f main demo-head                      # main carries the redundant work
git_c "$repo" checkout -q -b guard main && git_c "$repo" am -q "$root/demo/cpu-one-model-up-other-down.patch"
git -C "$repo" checkout -q main
# the revert as a commit of main's parent's tree on top of main
git -C "$repo" branch -q -f labels "$(git_c "$repo" commit-tree "main^^{tree}" -p main \
  -m "engine: take out the unused draft hint (the same output, less read per decode step)")"
for c in $cases; do
  t0=$(date +%s)
  "$bot" evaluate --repo "$repo" --base main --head "$c" --profile cpu-both --rules "$root/rules" --no-spec \
    --work-dir "$tmp/work" --out "$out/$c" > "$out/$c.log" 2>&1
  rc=$?
  echo "$(stamp) $c: exit $rc in $(( $(date +%s) - t0 )) s" | tee -a "$out/log.txt"
done
