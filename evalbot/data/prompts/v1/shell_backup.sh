#!/usr/bin/env bash
# backup.sh - nightly snapshot of a directory tree with rsync hard links.
#
# Each run makes a new dated directory under DEST. Files that have not changed
# since the previous snapshot are hard-linked to it instead of copied, so every
# snapshot looks complete but only changed files take new space. Old snapshots
# are pruned: keep the last 7 daily, then one per week for 8 weeks.
#
# usage: backup.sh SOURCE DEST [--dry-run]

set -euo pipefail

readonly KEEP_DAILY=7
readonly KEEP_WEEKLY=8

log() { printf '%s %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
    sed -n '2,10s/^# \{0,1\}//p' "$0"
    exit 2
}

[[ $# -ge 2 ]] || usage
src=${1%/}
dest=${2%/}
dry_run=()
[[ ${3:-} == "--dry-run" ]] && dry_run=(--dry-run)

[[ -d $src ]] || die "source $src is not a directory"
mkdir -p "$dest"

# Only one backup at a time: a second run while the first is copying would
# link against a half-finished snapshot.
exec 9>"$dest/.lock"
flock -n 9 || die "another backup of $dest is running"

stamp=$(date '+%Y-%m-%d_%H%M%S')
target="$dest/$stamp"
partial="$dest/.partial-$stamp"
latest=$(find "$dest" -mindepth 1 -maxdepth 1 -type d -name '20??-??-??_*' | sort | tail -n 1)

link_args=()
if [[ -n $latest ]]; then
    link_args=(--link-dest="$latest")
    log "linking unchanged files against $(basename "$latest")"
else
    log "no previous snapshot; this one will be a full copy"
fi

# Copy into a hidden partial directory and rename at the end, so that an
# interrupted run never looks like a finished snapshot.
trap 'log "interrupted; leaving $partial for inspection"' INT TERM
rsync -a --delete --numeric-ids --info=stats1 \
    "${dry_run[@]}" "${link_args[@]}" \
    --exclude='.cache/' --exclude='*.tmp' --exclude='node_modules/' \
    "$src/" "$partial/"
trap - INT TERM

if [[ ${#dry_run[@]} -gt 0 ]]; then
    log "dry run finished; nothing kept"
    rm -rf "$partial"
    exit 0
fi

mv "$partial" "$target"
log "snapshot written to $target"

# Pruning: walk snapshots newest first; keep the newest KEEP_DAILY outright,
# then keep the newest snapshot of each ISO week until KEEP_WEEKLY weeks are kept.
declare -A kept_weeks=()
count=0
while IFS= read -r dir; do
    name=$(basename "$dir")
    day=${name%%_*}
    count=$((count + 1))
    if (( count <= KEEP_DAILY )); then
        continue
    fi
    week=$(date -d "$day" '+%G-W%V')
    if [[ -z ${kept_weeks[$week]:-} && ${#kept_weeks[@]} -lt $KEEP_WEEKLY ]]; then
        kept_weeks[$week]=$name
        continue
    fi
    log "pruning $name"
    rm -rf -- "$dir"
done < <(find "$dest" -mindepth 1 -maxdepth 1 -type d -name '20??-??-??_*' | sort -r)

used=$(du -sh "$dest" | cut -f1)
log "done: $(find "$dest" -mindepth 1 -maxdepth 1 -type d -name '20??-??-??_*' | wc -l) snapshots, $used on disk"
