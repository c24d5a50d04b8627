"""One side's compile, made once: its first serving process compiles, and every later one starts from a copy
of that compile as it stood when the process was ready and warmed, before any timed request.

Why: on the H200 each fresh compile drew its own runtime choices (autotuned kernel configs, kernels picked
by timing) and kept its own decode speed for its whole life, from -2.3% to +1.9% (docs/benchmarks.md,
#40); a PR's engine cannot be trusted to compile deterministically, and a fresh compile also costs it
30-40 s a block. Why this gives the PR no channel from one timed process to the next:
- the snapshot is taken once, while the side's first process is frozen after its warm-up requests (fresh
  prompts that no timed request uses) and before its first timed request, so it cannot hold anything a
  timed request showed the engine;
- every later process gets its own fresh copy of that snapshot (at the same path, as extension builds need),
  in a side folder emptied before each start: what a process writes dies with it.
Only regular files, folders and symbolic links (as links, never followed) are copied; anything else in the
cache (a FIFO, a device, a socket) is left out, and a cache over the size or entry cap is not kept at all,
so that side compiles afresh each time.

What it does not remove: an engine that still tunes by timing at load is measured at the one draw its
first process made, for the whole evaluation. That draw is outside the CI: on the H100, fresh compiles of
an autotuning engine spread 0.7% sd (docs/benchmarks.md, #40). Main's engine tunes nothing at load, so
main carries no such draw; a PR that brings tuning back is judged on the draw it got.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

MAX_BYTES = 4 << 30
# every entry is copied again at each of the side's starts: a cache of a million empty files would cost
# minutes a block, and with them the A/B's time budget
MAX_ENTRIES = 100_000


def tree_bytes(root: Path, limit: int, max_entries: int | None = None) -> int | None:
    """Bytes of the regular files under root (links not followed), or None once past `limit` bytes or
    `max_entries` entries."""
    total = entries = 0
    max_entries = MAX_ENTRIES if max_entries is None else max_entries
    for dirpath, dirs, files in os.walk(root):
        entries += len(dirs) + len(files)
        if entries > max_entries:
            return None
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
                if total > limit:
                    return None
    return total


def snapshot(cache: Path, dest: Path, max_bytes: int | None = None) -> str | None:
    """Copy a side's compile cache to dest (files, folders, links as links; nothing else). None when kept,
    else why not (dest is then absent). `max_bytes`: MAX_BYTES unless given."""
    if dest.exists():
        raise ValueError(f"{dest} exists: a side's compile is kept once")
    if cache.is_symlink():  # the side may have swapped its cache folder for a link to one of the bot's
        return f"its compile cache {cache} is a link"
    if not cache.is_dir():
        return f"no compile cache at {cache}"
    cap = MAX_BYTES if max_bytes is None else max_bytes
    size = tree_bytes(cache, cap)
    if size is None:
        return f"its compile cache is over {cap >> 20} MiB or {MAX_ENTRIES} entries"
    tmp = dest.with_name(dest.name + ".partial")
    if tmp.exists() or tmp.is_symlink():
        remove(tmp)
    try:
        _copy(cache, tmp)
    except OSError as exc:  # an entry the side made unreadable: keep nothing rather than half
        if tmp.exists() or tmp.is_symlink():
            remove(tmp)
        return f"its compile cache could not be copied: {type(exc).__name__}: {str(exc)[:200]}"
    tmp.rename(dest)
    return None


def restore(snap: Path | None, cache: Path) -> None:
    """Make `cache` a fresh copy of a snapshot (an empty folder without one); whatever was there is gone."""
    if cache.exists() or cache.is_symlink():
        remove(cache)
    if snap is None:
        cache.mkdir(parents=True)
    else:
        _copy(snap, cache)


def remove(path: Path) -> None:
    """Delete a tree that sandboxed code wrote: links are removed, never followed; folders it made
    read-only are made writable first."""
    if path.is_symlink() or not path.is_dir():
        path.unlink()
        return
    os.chmod(path, 0o700)
    for dirpath, dirs, _files in os.walk(path):  # os.walk does not descend into linked folders
        for d in dirs:
            full = os.path.join(dirpath, d)
            if not os.path.islink(full):
                os.chmod(full, 0o700)
    shutil.rmtree(path)


def _copy(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True)
    for entry in os.scandir(src):
        target = dst / entry.name
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
        elif entry.is_dir(follow_symlinks=False):
            _copy(Path(entry.path), target)
        elif entry.is_file(follow_symlinks=False):
            shutil.copy2(entry.path, target, follow_symlinks=False)
