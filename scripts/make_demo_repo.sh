#!/usr/bin/env bash
# A local git repository for `make demo`: branch main = this checkout's HEAD, branch demo-head = main plus
# one contributor-style commit to the engine. The bot then judges demo-head against main, offline.
set -euo pipefail
src=$(git rev-parse --show-toplevel)
dest=${1:?usage: make_demo_repo.sh DEST}
rm -rf "$dest"
git clone -q --no-hardlinks "$src" "$dest"
cd "$dest"
git checkout -q -B main
git checkout -q -b demo-head
# The contributor's change: a comment-only edit to the model, i.e. an A/A comparison. The honest
# verdict is PASS with no tier: any "speedup" the bot reported here would be noise it let through.
printf '\n# demo: a contributor touched this file without changing what it computes\n' >> engine/model.py
git -c user.name=demo -c user.email=demo@example.invalid commit -qam "engine: comment-only change (A/A demo)"
echo "$dest: main $(git rev-parse --short main), demo-head $(git rev-parse --short demo-head)"
