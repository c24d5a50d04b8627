"""Each side's serving processes share one compile-cache path (only the first pays the compile) and nothing
else: a fresh working folder each, and main's and the PR's roots apart."""

from __future__ import annotations

import pytest

from evalbot.evaluate.context import EvalConfig, RunContext, fresh_scratch, sandbox_spec
from evalbot.rules import default_rules_dir, load_rules

CACHE_VARS = ("XDG_CACHE_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


def _ctx(tmp_path):
    cfg = EvalConfig(tmp_path, "main", "head", load_rules(default_rules_dir()), "gpu", tmp_path)
    return RunContext(cfg, lambda _m: None, tmp_path / "run")


def test_one_sides_processes_share_their_caches_path_and_nothing_across_sides(tmp_path):
    ctx = _ctx(tmp_path)
    specs = {}
    for side in ("base", "head", "base"):
        root = ctx.scratch / "serve" / side
        work = fresh_scratch(ctx, f"{side}-serve", under=root)
        specs.setdefault(side, []).append(sandbox_spec(ctx, tmp_path, work, [], 60, side_root=root))
    first, second = specs["base"]
    assert first.workdir != second.workdir and first.env["HOME"] != second.env["HOME"]  # fresh each time
    assert all(first.env[k] == second.env[k] for k in CACHE_VARS)  # the same path: no rebuild
    (head,) = specs["head"]
    assert first.scratch != head.scratch  # the writable binds
    assert not head.scratch.is_relative_to(first.scratch) and not first.scratch.is_relative_to(head.scratch)
    for k in CACHE_VARS:
        assert first.env[k].startswith(str(first.scratch)) and head.env[k].startswith(str(head.scratch))


def test_without_a_side_root_everything_stays_in_the_process_scratch(tmp_path):
    ctx = _ctx(tmp_path)
    work = fresh_scratch(ctx, "audit")
    spec = sandbox_spec(ctx, tmp_path, work, [], 60)
    assert spec.scratch == work and all(spec.env[k].startswith(str(work)) for k in CACHE_VARS)
    with pytest.raises(ValueError, match="not inside the side's root"):
        sandbox_spec(ctx, tmp_path, work, [], 60, side_root=ctx.scratch / "serve" / "head")


def test_only_mains_processes_share_a_root_the_prs_get_a_fresh_scratch_each(tmp_path):
    from evalbot.evaluate.runner import serve_dirs
    from evalbot.model import Side

    ctx = _ctx(tmp_path)
    (m1, mroot), (m2, mroot2) = serve_dirs(ctx, Side.BASE), serve_dirs(ctx, Side.BASE)
    (h1, hroot), (h2, hroot2) = serve_dirs(ctx, Side.HEAD), serve_dirs(ctx, Side.HEAD)
    assert mroot == mroot2 and m1 != m2 and m1.is_relative_to(mroot) and m2.is_relative_to(mroot)
    assert hroot is None and hroot2 is None and h1 != h2
    assert not h1.is_relative_to(mroot) and not h2.is_relative_to(mroot)
    # the PR's sandbox may write its own scratch and nothing a later process of it will see
    s1, s2 = (sandbox_spec(ctx, tmp_path, h, [], 60, side_root=None) for h in (h1, h2))
    assert s1.scratch == h1 and s2.scratch == h2 and not s2.scratch.is_relative_to(s1.scratch)
    assert all(s1.env[k] != s2.env[k] for k in CACHE_VARS)
