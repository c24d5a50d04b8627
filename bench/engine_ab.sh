#!/usr/bin/env bash
# Decode speed of two revisions of this repository's engine, interleaved on one box (A B B A ...):
#   bash bench/engine_ab.sh REV_A REV_B [ALTERNATIONS] [-- extra `python -m engine bench` args]
# Each revision is checked out into a temporary worktree and run with this checkout's venv; every run is a
# fresh process. Prints one line per run and the median decode tok/s of each side with their ratio.
set -euo pipefail
a=${1:?REV_A}; b=${2:?REV_B}; n=${3:-3}; shift $(( $# < 3 ? $# : 3 ))
[ "${1:-}" = "--" ] && shift
extra=("$@"); [ ${#extra[@]} -eq 0 ] && extra=(--model qwen2.5-coder-0.5b --ctx 128 --gen 64 --runs 1)
root=$(git rev-parse --show-toplevel); py="$root/.venv/bin/python"
tmp=$(mktemp -d); trap 'git -C "$root" worktree remove --force "$tmp/a" >/dev/null 2>&1 || true; git -C "$root" worktree remove --force "$tmp/b" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git -C "$root" worktree add -q --detach "$tmp/a" "$a"; git -C "$root" worktree add -q --detach "$tmp/b" "$b"
run() { (cd "$tmp/$1" && PYTHONDONTWRITEBYTECODE=1 "$py" -m engine bench "${extra[@]}" 2>/dev/null) | "$py" -c 'import json,sys; print(json.loads(sys.stdin.read())["decode_tps"])'; }
: > "$tmp/a.txt"; : > "$tmp/b.txt"
for i in $(seq 1 "$n"); do
  for side in $([ $((i % 2)) -eq 1 ] && echo "a b" || echo "b a"); do
    tps=$(run "$side"); echo "$side $tps" | tee -a "$tmp/runs.txt"; echo "$tps" >> "$tmp/$side.txt"
  done
done
"$py" - "$tmp/a.txt" "$tmp/b.txt" "$a" "$b" <<'PY'
import statistics, sys
a = [float(x) for x in open(sys.argv[1]).read().split()]; b = [float(x) for x in open(sys.argv[2]).read().split()]
ma, mb = statistics.median(a), statistics.median(b)
print(f"A {sys.argv[3]}: median {ma:.3f} tok/s {a}\nB {sys.argv[4]}: median {mb:.3f} tok/s {b}\nB/A {mb / ma:.4f}")
PY
