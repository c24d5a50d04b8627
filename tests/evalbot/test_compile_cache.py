"""A side's compile caches travel from its previous serving process's scratch to its next one: files only,
never a link, never past the cap, never from nothing."""

from __future__ import annotations

import os
from pathlib import Path

from evalbot.evaluate.context import carry_compile_cache


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_compile_caches_are_copied_and_nothing_else(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    (old / ".inductor" / "fx").mkdir(parents=True)
    (old / ".triton" / "k").mkdir(parents=True)
    (old / ".inductor" / "fx" / "graph.py").write_bytes(b"code")
    (old / ".triton" / "k" / "kernel.cubin").write_bytes(b"\x00sass")
    (old / "prompts.cache").write_text("what the last process saw")  # not a compile cache: stays behind
    new.mkdir()
    assert carry_compile_cache(old, new) == 4 + 5
    assert _tree(new) == {".inductor/fx/graph.py": b"code", ".triton/k/kernel.cubin": b"\x00sass"}


def test_links_are_skipped_never_followed(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("the bot's key")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "x").write_text("outside")
    old, new = tmp_path / "old", tmp_path / "new"
    (old / ".inductor").mkdir(parents=True)
    os.symlink(secret, old / ".inductor" / "key")
    os.symlink(tmp_path / "dir", old / ".inductor" / "linked-dir")
    os.symlink(tmp_path / "dir", old / ".triton")
    new.mkdir()
    assert carry_compile_cache(old, new) == 0
    assert _tree(new) == {} and not any(p.is_symlink() for p in new.rglob("*"))


def test_a_cache_past_the_cap_or_no_previous_process_carries_nothing(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    (old / ".inductor").mkdir(parents=True)
    (old / ".inductor" / "big").write_bytes(b"x" * 1000)
    new.mkdir()
    assert carry_compile_cache(old, new, cap_bytes=999) == 0 and _tree(new) == {}
    assert carry_compile_cache(None, new) == 0
    assert carry_compile_cache(old, new, cap_bytes=1000) == 1000
