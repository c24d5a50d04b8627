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
