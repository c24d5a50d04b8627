#!/usr/bin/env bash
# A local git repository for `make demo`: branch main = this checkout's HEAD, branch demo-head = main plus
# a contributor's real engine change, demo/cpu-int8-weights.patch. The bot then judges demo-head against
# main, offline: it builds both, runs them sandboxed and interleaved, and gates them against llama.cpp.
set -euo pipefail
src=$(git rev-parse --show-toplevel)
dest=${1:?usage: make_demo_repo.sh DEST}
patch=${2:-$src/demo/cpu-int8-weights.patch}
rm -rf "$dest"
git clone -q --no-hardlinks "$src" "$dest"
cd "$dest"
git checkout -q -B main
git checkout -q -b demo-head
git -c user.name=demo -c user.email=demo@example.invalid am -q "$patch"
echo "$dest: main $(git rev-parse --short main), demo-head $(git rev-parse --short demo-head) ($(git log -1 --format=%s))"
