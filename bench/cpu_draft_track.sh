#!/usr/bin/env bash
# The speculative track with a draft model, end to end on the real models: Qwen2.5-Coder-1.5B the target,
# its 0.5B (models.yaml `spec.draft`) drafting, the cpu profile's measurement, one A/A run through
# `evalbot calibrate` (equal code: a fresh clone of this checkout's HEAD on both sides):
#   bash bench/cpu_draft_track.sh OUT_DIR
# The rules are this checkout's with two changes, written to OUT_DIR/rules: the cpu profile measures the
# 1.5B (models.yaml), and the spec track drafts with the draft model and scores the 1.5B at 512
# (tracks.yaml). Accuracy is off (--no-accuracy: the 1.5B's llama.cpp reference is #38's, not this run's
# question). Writes OUT_DIR/calib.json, calib.log and log.txt (start, end, exit status).
set -uo pipefail
out=${1:?OUT_DIR}
root=$(git rev-parse --show-toplevel); bot="$root/.venv/bin/evalbot"
mkdir -p "$out"; tmp=$(mktemp -d /tmp/cpu-draft.XXXX)
stamp() { date -u +%Y-%m-%dT%H:%M:%SZ; }
echo "$(stamp) start: HEAD $(git -C "$root" rev-parse --short HEAD), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)" | tee -a "$out/log.txt"
rm -rf "$out/rules" && cp -r "$root/rules" "$out/rules"
"$root/.venv/bin/python" - "$out/rules" <<'PY'
import re, sys
from pathlib import Path
d = Path(sys.argv[1])
m = d / "models.yaml"
s = m.read_text()
large = "    - registry: qwen2.5-coder-1.5b\n      sha256: cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046\n"
s, n = re.subn(r"(  cpu:\n)    - registry: qwen2\.5-coder-0\.5b\n      sha256: [0-9a-f]+\n", lambda mm: mm.group(1) + large, s, count=1)
assert n == 1, "models.yaml: the cpu profile's 0.5B entry not found"
m.write_text(s)
t = d / "tracks.yaml"
s = t.read_text()
s, n1 = re.subn(r"(\nspec:\n  metric: spec\n  drafter: )ngram\n", r"\1draft\n", s, count=1)
s, n2 = re.subn(r"      qwen2\.5-coder-0\.5b: \{scored: \[512\], label: perf-spec\}", "      qwen2.5-coder-1.5b: {scored: [512], label: perf-spec}", s, count=1)
assert n1 == n2 == 1, "tracks.yaml: the spec track's drafter or model not found"
t.write_text(s)
PY
"$bot" rules check "$out/rules" | tail -3 | tee -a "$out/log.txt"
git clone -q "$root" "$tmp/repo"
t0=$(date +%s)
"$bot" calibrate --repo "$tmp/repo" --rev HEAD --runs 1 --profile cpu --rules "$out/rules" --no-accuracy \
  --state "$tmp/state.db" --work-dir "$tmp/work" --json > "$out/calib.json" 2> "$out/calib.log"
rc=$?
echo "$(stamp) calibrate: exit $rc in $(( $(date +%s) - t0 )) s" | tee -a "$out/log.txt"
