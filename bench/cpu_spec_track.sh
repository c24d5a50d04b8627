#!/usr/bin/env bash
# The speculative track (tracks.yaml) end to end on the real 0.5B, the cpu profile with every gate:
#   bash bench/cpu_spec_track.sh OUT_DIR [PATCH]
# A contest repository whose main is this checkout with PATCH, a weaker drafter (default
# demo/cpu-weak-drafter.patch: the n-gram drafter looks up the last token alone; demo/cpu-short-drafts.patch:
# it drafts one token a step), and a PR that takes it out again: a better drafter, the same plain decode.
# It must earn a speculative tier and no decode tier.
# Writes OUT_DIR/spec/ (report.md, result.json, receipt.json), its log and its time.
set -uo pipefail
out=${1:?OUT_DIR}
root=$(git rev-parse --show-toplevel); bot="$root/.venv/bin/evalbot"
mkdir -p "$out"; tmp=$(mktemp -d /tmp/cpu-spec.XXXX)
stamp() { date -u +%Y-%m-%dT%H:%M:%SZ; }
echo "$(stamp) start: ${2:-demo/cpu-weak-drafter.patch}, HEAD $(git -C "$root" rev-parse --short HEAD), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)" | tee -a "$out/log.txt"
repo="$tmp/repo"
patch=${2:-$root/demo/cpu-weak-drafter.patch}
bash "$root/scripts/make_demo_repo.sh" "$repo" "$(realpath "$patch")" > /dev/null
git -C "$repo" branch -q -f main demo-head
git -C "$repo" checkout -q main
git -C "$repo" branch -q -f better-drafter "$(git -C "$repo" -c user.name=contributor -c user.email=c@example.invalid \
  commit-tree "main^^{tree}" -p main -m "engine: n-gram lookup on the longest suffix again (more drafts accepted)")"
t0=$(date +%s)
"$bot" evaluate --repo "$repo" --base main --head better-drafter --profile cpu --rules "$root/rules" \
  --work-dir "$tmp/work" --out "$out/spec" > "$out/spec.log" 2>&1
rc=$?
echo "$(stamp) spec: exit $rc in $(( $(date +%s) - t0 )) s" | tee -a "$out/log.txt"
