"""Each side's serving processes start in one side folder, emptied before every start, with a copy of the
side's first compile (`compile_cache`): the same paths for every process of a side (an extension build
copied elsewhere is built again), nothing a process wrote for the next one to read, main's and the PR's
folders apart.

The attacks these tests stand for: a PR's process that leaves a memo (of timed prompts, of its own state) in
its scratch, its caches or its side folder for its next process; a compile cache that carries a link to a
file of the bot's, a FIFO that hangs the copy, read-only folders that stop the emptying, files the bot
cannot read, a cache swapped for a link to a folder outside; and a snapshot taken after a timed request.
Root ignores file modes, so the tests about modes run as an unprivileged user where the suite runs as root.
"""

from __future__ import annotations

import itertools
import os
import shutil
import stat
import tempfile
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest

from evalbot.evaluate import ab_block, ab_samples, abtest, box, compile_cache, sandbox
from evalbot.evaluate.compile_cache import remove, restore, snapshot
from evalbot.evaluate.context import SIDE_MOUNT, RunContext, Workspace, fresh_scratch, sandbox_spec
from evalbot.evaluate.served_model import keep_compiles, serve_dirs
from evalbot.evaluate.timed import Timed
from evalbot.model import EvalRequest, RunOptions, Side
from evalbot.rules import default_rules_dir, load_rules
from evalbot.rules.schema import Context, Measurement, Profile, Quiet

CACHE_VARS = ("XDG_CACHE_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")
SECRET = b"ghp_the-bots-token-never-to-be-copied"
RULES = load_rules(default_rules_dir())
NOBODY = 65534


def _ctx(
    tmp_path: Path, scratch: Path | None = None, logged: list[str] | None = None, no_sandbox: bool = False
) -> RunContext:
    req = EvalRequest(
        "a" * 40,
        "b" * 40,
        "b" * 40,
        RULES.rules_hash,
        RULES.profile("gpu"),
        options=RunOptions(no_sandbox=no_sandbox),
    )
    ws = Workspace(tmp_path, tmp_path, RULES)
    return RunContext(req, ws, (logged if logged is not None else []).append, scratch or tmp_path / "run")


def _tree(root: Path) -> dict[str, object]:
    """Everything under root, links not followed: path -> bytes (files), "dir", ("link", target) or "other"."""
    out: dict[str, object] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            full = Path(dirpath) / name
            rel = str(full.relative_to(root))
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = "dir"
            elif stat.S_ISREG(st.st_mode):
                out[rel] = full.read_bytes()
            else:
                out[rel] = "other"
    return out


def _regular_bytes(root: Path) -> list[bytes]:
    return [v for v in _tree(root).values() if isinstance(v, bytes)]


def _plant(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def _unprivileged(fn: Callable[[Path], None]) -> None:
    """Run fn(a fresh folder it owns) as an unprivileged user: in a child that drops to nobody where the
    suite runs as root (root reads, writes and deletes whatever the modes say), else here. A failure in the
    child fails the test with its traceback."""
    d = Path(tempfile.mkdtemp(prefix="evalbot-cc-"))
    try:
        if os.getuid() != 0:
            fn(d)
            return
        os.chown(d, NOBODY, NOBODY)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                os.close(r)
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                fn(d)
                code = 0
            except BaseException:
                os.write(w, traceback.format_exc().encode())
            finally:
                os._exit(code)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            report = f.read().decode()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, f"as uid {NOBODY}:\n{report}"
    finally:
        for dirpath, dirs, _files in os.walk(d):  # root may delete anything; this only tidies the modes
            for x in dirs:
                if not os.path.islink(os.path.join(dirpath, x)):
                    os.chmod(os.path.join(dirpath, x), 0o700)
        shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------ serve_dirs: one side folder per side


def test_every_process_of_a_side_sees_the_same_paths_and_the_sides_are_apart(tmp_path):
    ctx = _ctx(tmp_path)
    specs: dict[Side, list] = {Side.BASE: [], Side.HEAD: []}
    for side in (Side.BASE, Side.HEAD, Side.BASE, Side.HEAD):
        scratch, root = serve_dirs(ctx, side)
        assert root == ctx.scratch / "serve" / side.value
        assert scratch == root / "work" and (root / "caches").is_dir()
        specs[side].append(sandbox_spec(ctx, tmp_path, scratch, [], 60, side_root=root))
    for side, (first, second) in specs.items():
        root = ctx.scratch / "serve" / side.value
        assert first.scratch == second.scratch == root  # the writable bind: the side folder
        assert first.workdir == second.workdir == root / "work"
        assert first.scratch_at == second.scratch_at == SIDE_MOUNT  # mounted where either side's is
        for k in CACHE_VARS:  # one path for every process of a side: no rebuild of extension builds
            assert first.env[k] == second.env[k]
            assert Path(first.env[k]).is_relative_to(SIDE_MOUNT / "caches")
        assert first.env["HOME"] == second.env["HOME"] == str(SIDE_MOUNT / "work")
        assert "--chdir" in (argv := sandbox.bwrap_argv(first, ["true"]))
        assert argv[argv.index("--chdir") + 1] == str(SIDE_MOUNT / "work")
        assert ["--bind", str(root), str(SIDE_MOUNT)] == argv[
            argv.index(str(root)) - 1 : argv.index(str(root)) + 2
        ]
    base, head = specs[Side.BASE][0], specs[Side.HEAD][0]
    # the host folders are apart; what the engines see is the same, byte for byte
    assert not base.scratch.is_relative_to(head.scratch) and not head.scratch.is_relative_to(base.scratch)
    assert base.env == head.env
    assert sandbox.bwrap_argv(base, ["x"]) == [
        a.replace(str(head.scratch), str(base.scratch)) for a in sandbox.bwrap_argv(head, ["x"])
    ]


def test_unsandboxed_the_sides_keep_their_own_host_paths(tmp_path):
    ctx = _ctx(tmp_path, no_sandbox=True)
    for side in (Side.BASE, Side.HEAD):
        scratch, root = serve_dirs(ctx, side)
        spec = sandbox_spec(ctx, tmp_path, scratch, [], 60, side_root=root)
        assert spec.scratch_at is None and spec.env["HOME"] == str(root / "work")
        for k in CACHE_VARS:
            assert Path(spec.env[k]).is_relative_to(root / "caches")


def test_nothing_a_process_wrote_anywhere_in_its_side_folder_reaches_the_next_one(tmp_path):
    ctx = _ctx(tmp_path)
    for side in (Side.BASE, Side.HEAD):
        scratch, root = serve_dirs(ctx, side)
        _plant(
            root, {"memo": b"1", "work/memo": b"2", "work/deep/er/memo": b"3", "caches/.inductor/memo": b"4"}
        )
        os.symlink(root / "work" / "memo", root / "caches" / "link")
        os.mkfifo(root / "work" / "pipe")
        scratch2, root2 = serve_dirs(ctx, side)
        assert (scratch2, root2) == (scratch, root)
        assert _tree(root2) == {"work": "dir", "caches": "dir"}  # no channel between timed processes


def test_starting_one_side_leaves_the_other_sides_running_process_alone(tmp_path):
    ctx = _ctx(tmp_path)
    _, base_root = serve_dirs(ctx, Side.BASE)
    _plant(base_root, {"work/loaded": b"main", "caches/.triton/k": b"kernel"})
    serve_dirs(ctx, Side.HEAD)
    assert _tree(base_root)["work/loaded"] == b"main" and _tree(base_root)["caches/.triton/k"] == b"kernel"


def test_with_a_kept_compile_each_process_starts_from_a_fresh_copy_of_exactly_it(tmp_path):
    ctx = _ctx(tmp_path)
    src = tmp_path / "first-compile"
    _plant(src, {".inductor/fx/a.py": b"kernel a", ".triton/b/c.cubin": b"\x00\x01cubin", ".cache/x": b"x"})
    os.symlink("fx/a.py", src / ".inductor" / "rel-link")
    snap = ctx.scratch / "serve" / "head.compiled"
    assert snapshot(src, snap) is None
    ctx.compiled[Side.HEAD] = snap
    kept = _tree(snap)
    assert kept == _tree(src)
    _, root = serve_dirs(ctx, Side.HEAD)
    assert _tree(root / "caches") == kept and _tree(root) == {
        "work": "dir",
        "caches": "dir",
        **{f"caches/{k}": v for k, v in kept.items()},
    }
    # the process rewrites its copy: a memo, an edited kernel, a deleted file
    cubin = root / "caches" / ".triton" / "b" / "c.cubin"
    assert os.stat(cubin).st_ino != os.stat(snap / ".triton" / "b" / "c.cubin").st_ino  # a copy, no hard link
    cubin.write_bytes(b"a memo of timed prompts")
    (root / "caches" / ".cache" / "x").unlink()
    _plant(root, {"caches/.inductor/memo": b"seen", "work/memo": b"seen"})
    assert _tree(snap) == kept  # the kept compile did not move
    _, root2 = serve_dirs(ctx, Side.HEAD)
    assert _tree(root2 / "caches") == kept and _tree(root2 / "work") == {}
    # main has no kept compile: its caches start empty, whatever the PR's hold
    _, base_root = serve_dirs(ctx, Side.BASE)
    assert _tree(base_root) == {"work": "dir", "caches": "dir"}


def test_without_a_side_root_everything_stays_in_the_process_scratch(tmp_path):
    ctx = _ctx(tmp_path)
    work = fresh_scratch(ctx, "audit")
    spec = sandbox_spec(ctx, tmp_path, work, [], 60)
    assert spec.scratch == work and all(spec.env[k].startswith(str(work)) for k in CACHE_VARS)
    with pytest.raises(ValueError, match="not inside the side's root"):
        sandbox_spec(ctx, tmp_path, work, [], 60, side_root=ctx.scratch / "serve" / "head")


# ------------------------------------------------------------------ keep_compiles: once per side


def test_a_sides_compile_is_kept_once_as_it_stood_and_outside_the_side_folder(tmp_path):
    ctx = _ctx(tmp_path)
    procs = {Side.BASE: object(), Side.HEAD: object()}
    roots = {}
    for side in procs:
        _, roots[side] = serve_dirs(ctx, side)
        _plant(
            roots[side], {f"caches/.inductor/{side.value}": side.value.encode(), "caches/.triton/k": b"k1"}
        )
    keep_compiles(ctx, procs)  # type: ignore[arg-type]
    assert set(ctx.compiled) == {Side.BASE, Side.HEAD} and not ctx.compile_notes
    first = {side: _tree(ctx.compiled[side]) for side in procs}
    for side in procs:
        assert first[side] == {
            ".inductor": "dir",
            f".inductor/{side.value}": side.value.encode(),
            ".triton": "dir",
            ".triton/k": b"k1",
        }
        for r in roots.values():  # out of reach of either side's sandbox, and emptied with neither
            assert not ctx.compiled[side].is_relative_to(r)
    assert ctx.compiled[Side.BASE] != ctx.compiled[Side.HEAD]
    # afterwards (timed requests): the processes write their caches; a second call keeps nothing new
    for r in roots.values():
        _plant(r, {"caches/.triton/k": b"k2: a memo of timed prompts", "caches/memo": b"seen"})
    kept_at = dict(ctx.compiled)
    keep_compiles(ctx, procs)  # type: ignore[arg-type]
    assert ctx.compiled == kept_at and not ctx.compile_notes
    assert {side: _tree(ctx.compiled[side]) for side in procs} == first
    for side in procs:  # the next process gets the compile as it stood when kept
        _, root = serve_dirs(ctx, side)
        assert _tree(root / "caches") == first[side] and _tree(root / "work") == {}


def test_a_cache_over_the_cap_is_not_kept_and_the_reason_is_noted(tmp_path, monkeypatch):
    logged: list[str] = []
    ctx = _ctx(tmp_path, logged=logged)
    # keep_compiles calls compile_cache.snapshot with its default cap, bound when defined: a small cap here
    monkeypatch.setattr(compile_cache, "snapshot", partial(snapshot, max_bytes=100))
    _, root = serve_dirs(ctx, Side.HEAD)
    _plant(root, {"caches/.inductor/big": b"x" * 101})
    keep_compiles(ctx, {Side.HEAD: object()})  # type: ignore[dict-item]
    assert Side.HEAD not in ctx.compiled
    assert "over" in ctx.compile_notes[Side.HEAD]
    assert any("the PR's compile is not kept" in m for m in logged)
    assert [p.name for p in (ctx.scratch / "serve").iterdir()] == ["head"]  # no copy, no partial copy
    (root / "caches" / ".inductor" / "big").write_bytes(b"small")  # it shrinks: still not kept
    keep_compiles(ctx, {Side.HEAD: object()})  # type: ignore[dict-item]
    assert Side.HEAD not in ctx.compiled
    _, root2 = serve_dirs(ctx, Side.HEAD)
    assert _tree(root2) == {"work": "dir", "caches": "dir"}  # each process compiles anew


def test_the_cap_counts_regular_file_bytes_and_refuses_nothing_at_the_cap(tmp_path):
    cache = tmp_path / "cache"
    _plant(cache, {"a": b"x" * 60, "d/b": b"y" * 40})
    os.symlink("/" + "z" * 200, cache / "long-link")  # a link's own size is not a file's bytes
    assert compile_cache.tree_bytes(cache, 1000) == 100
    assert snapshot(cache, tmp_path / "at", max_bytes=100) is None
    why = snapshot(cache, tmp_path / "over", max_bytes=99)
    assert why is not None and "over" in why
    assert not (tmp_path / "over").exists() and not (tmp_path / "over.partial").exists()
    why = snapshot(tmp_path / "missing", tmp_path / "none")
    assert why is not None and "no compile cache" in why and not (tmp_path / "none").exists()


def test_restore_replaces_whatever_the_cache_held(tmp_path):
    snap = tmp_path / "snap"
    _plant(snap, {".inductor/k": b"kernel"})
    cache = tmp_path / "cache"
    _plant(cache, {".inductor/k": b"edited", ".inductor/memo": b"seen", "memo": b"seen"})
    restore(snap, cache)
    assert _tree(cache) == _tree(snap) == {".inductor": "dir", ".inductor/k": b"kernel"}
    _plant(cache, {"memo": b"seen"})
    restore(None, cache)
    assert cache.is_dir() and _tree(cache) == {}
    restore(None, tmp_path / "new" / "cache")  # and where there was none
    assert _tree(tmp_path / "new") == {"cache": "dir"}


def test_snapshot_refuses_an_existing_destination(tmp_path):
    cache = tmp_path / "cache"
    _plant(cache, {"a": b"new"})
    dest = tmp_path / "dest"
    _plant(dest, {"old": b"kept"})
    with pytest.raises(ValueError, match="exists"):
        snapshot(cache, dest)
    assert _tree(dest) == {"old": b"kept"}
    (tmp_path / "file").write_bytes(b"f")
    with pytest.raises(ValueError):
        snapshot(cache, tmp_path / "file")


# ------------------------------------------------------------------ hostile content


def test_links_to_outside_are_copied_as_links_never_followed_and_never_touched(tmp_path):
    secret = tmp_path / "bot" / "token"
    _plant(tmp_path / "bot", {"token": SECRET})
    outside_dir = tmp_path / "outside"
    _plant(outside_dir, {"inner": SECRET})
    os.chmod(outside_dir, 0o500)
    cache = tmp_path / "cache"
    _plant(cache, {".inductor/ok": b"kernel"})
    os.symlink(secret, cache / "to-file")
    os.symlink(outside_dir, cache / ".inductor" / "to-dir")
    os.symlink("../../bot/token", cache / "relative")
    os.symlink(cache / "loop", cache / "loop")
    try:
        snap = tmp_path / "snap"
        assert snapshot(cache, snap) is None
        kept = _tree(snap)
        assert kept["to-file"] == ("link", str(secret))
        assert kept[".inductor/to-dir"] == ("link", str(outside_dir))
        assert kept["relative"] == ("link", "../../bot/token")
        assert kept["loop"] == ("link", str(cache / "loop"))
        assert SECRET not in b"".join(_regular_bytes(snap))  # the link, not the secret's bytes
        again = tmp_path / "again"
        restore(snap, again)
        assert _tree(again) == kept and SECRET not in b"".join(_regular_bytes(again))
        for tree in (again, cache, snap):
            remove(tree)
            assert not tree.exists() and not tree.is_symlink()
        assert secret.read_bytes() == SECRET  # the link's targets: neither deleted nor changed
        assert stat.S_IMODE(os.stat(outside_dir).st_mode) == 0o500
        assert (outside_dir / "inner").read_bytes() == SECRET
        link = tmp_path / "a-link"  # a cache that is itself a link: the link goes, its target stays
        os.symlink(outside_dir, link)
        restore(None, link)
        assert not link.is_symlink() and link.is_dir() and _tree(link) == {}
        assert stat.S_IMODE(os.stat(outside_dir).st_mode) == 0o500 and (outside_dir / "inner").exists()
    finally:
        os.chmod(outside_dir, 0o700)


def test_a_cache_swapped_for_a_link_to_a_folder_outside_is_not_copied_through(tmp_path):
    """The PR's sandbox may write its whole side folder, so it may replace root/caches by a link to a
    folder of the bot's (the host's paths are the sandbox's). The snapshot is taken by the bot, outside the
    sandbox: following that link would copy the bot's files into every later process of the PR."""
    bot_dir = tmp_path / "bot-state"
    _plant(bot_dir, {"token": SECRET})
    ctx = _ctx(tmp_path)
    _, root = serve_dirs(ctx, Side.HEAD)
    shutil.rmtree(root / "caches")
    os.symlink(bot_dir, root / "caches")
    keep_compiles(ctx, {Side.HEAD: object()})  # type: ignore[dict-item]
    if Side.HEAD in ctx.compiled:
        leaked = SECRET in b"".join(_regular_bytes(ctx.compiled[Side.HEAD]))
        assert not leaked, (
            "compile_cache.snapshot followed root/caches, a link to a folder outside, and copied the bot's "
            "token into the PR's kept compile (cache.is_dir() and os.walk/os.scandir follow a top-level link)"
        )
    _, root2 = serve_dirs(ctx, Side.HEAD)
    assert SECRET not in b"".join(_regular_bytes(root2)), "the bot's token reached the PR's next process"
    assert (bot_dir / "token").read_bytes() == SECRET


def test_a_fifo_in_the_cache_is_left_out_and_hangs_nothing(tmp_path):
    cache = tmp_path / "cache"
    _plant(cache, {".triton/k": b"kernel"})
    fifo = cache / ".triton" / "pipe"
    os.mkfifo(fifo)
    snap, again = tmp_path / "snap", tmp_path / "again"
    done: dict[str, object] = {}

    def work() -> None:
        try:
            done["why"] = snapshot(cache, snap)
            restore(snap, again)
            remove(cache)
            done["ok"] = True
        except BaseException as exc:  # surfaced below
            done["error"] = exc

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(5)
    if t.is_alive():  # something opened the FIFO for reading: a writer lets it go, then fail
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        t.join(5)
        pytest.fail("the snapshot opened a FIFO in the cache and hung on it")
    assert "error" not in done, done.get("error")
    assert done["why"] is None
    assert _tree(snap) == {".triton": "dir", ".triton/k": b"kernel"}  # the FIFO is left out
    assert _tree(again) == _tree(snap) and not cache.exists()


def test_read_only_folders_do_not_stop_the_emptying(tmp_path):
    def body(d: Path) -> None:
        tree = d / "tree"
        _plant(tree, {"ro/f": b"1", "ro/sub/g": b"2", "none/h": b"3", "ro/sub/deeper/i": b"4"})
        for p in ("ro/sub/deeper", "ro/sub", "ro"):
            os.chmod(tree / p, 0o500)
        os.chmod(tree / "none", 0o000)
        os.chmod(tree, 0o500)
        remove(tree)
        assert not tree.exists()
        # the same from a process's side folder, at the next start
        ctx = _ctx(d, scratch=d / "run")
        _, root = serve_dirs(ctx, Side.HEAD)
        _plant(root, {"work/ro/f": b"memo", "caches/ro/g": b"memo", "ro/h": b"memo"})
        for p in ("work/ro", "caches/ro", "ro", "work", "caches"):
            os.chmod(root / p, 0o500)
        os.chmod(root, 0o500)
        _, root2 = serve_dirs(ctx, Side.HEAD)
        assert _tree(root2) == {"work": "dir", "caches": "dir"}

    _unprivileged(body)


@pytest.mark.parametrize("locked", ["file", "folder"])
def test_a_cache_entry_the_bot_cannot_read_does_not_crash_the_snapshot(tmp_path, locked):
    """A PR's process owns its cache and may chmod 000 a file or folder in it; the bot (the same user,
    not root) then cannot read it. keep_compiles runs inside abtest.measure's block, where anything but a
    SideError ends the whole evaluation: the snapshot must leave the entry out or not keep the compile."""

    def body(d: Path) -> None:
        ctx = _ctx(d, scratch=d / "run")
        _, root = serve_dirs(ctx, Side.HEAD)
        _plant(root, {"caches/.inductor/ok": b"kernel", "caches/locked/f": b"x", "caches/lockedfile": b"y"})
        os.chmod(root / "caches" / ("lockedfile" if locked == "file" else "locked"), 0o000)
        try:
            keep_compiles(ctx, {Side.HEAD: object()})  # type: ignore[dict-item]
        except PermissionError as exc:
            raise AssertionError(
                f"keep_compiles -> compile_cache.snapshot raised {exc!r} on an unreadable {locked} in the "
                "PR's cache (compile_cache._copy: shutil.copy2 / os.scandir), leaving "
                f"{sorted(p.name for p in (ctx.scratch / 'serve').iterdir())}"
            ) from exc
        assert (Side.HEAD in ctx.compiled) != (Side.HEAD in ctx.compile_notes)
        if Side.HEAD in ctx.compiled:
            assert _tree(ctx.compiled[Side.HEAD])[".inductor/ok"] == b"kernel"
        _, root2 = serve_dirs(ctx, Side.HEAD)  # and the next start empties it all the same
        assert _tree(root2 / "work") == {} and "memo" not in _tree(root2 / "caches")

    _unprivileged(body)


# ------------------------------------------------------------------ abtest.measure: when `settled` runs

GEN = 8


@dataclass
class Engine:
    """A stand-in serving process in its side folder: it compiles at start unless its caches hold the
    compile, and memoizes every prompt it is asked in its caches (the attack a kept compile must not carry
    from one timed process to the next)."""

    side: Side
    root: Path
    events: list[tuple]
    label: str = ""
    frozen: bool = False
    # the CPU time read at the last freeze: -1, unmetered, as a real process without a meter reads
    frozen_cpu_ns: int = -1
    device: None = None  # no GPU idle probe: a CPU profile
    device_idle_ns: int = 0
    ready: dict = field(default_factory=dict)
    vocab: int = 100
    found: dict[str, object] = field(default_factory=dict)
    clock: itertools.count = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.label = self.side.value
        caches = self.root / "caches"
        self.found = _tree(caches)
        if not (caches / "kernel.bin").exists():
            self.events.append(("compile", self.side))
            (caches / "kernel.bin").write_bytes(b"compiled")

    def cpu_s(self) -> float | None:
        return None

    def wait_ready(self, timeout_s: float) -> dict:
        return self.ready

    def freeze(self, drain: bool = True) -> None:
        self.frozen = True

    def thaw(self) -> None:
        self.frozen = False

    def close(self) -> None:
        self.events.append(("close", self.side))

    def request(self, body: dict, timeout_s: float) -> Timed:
        assert not self.frozen
        serial = body["prompt_ids"][0]
        self.events.append(("request", self.side, serial))
        (self.root / "caches" / f"memo-{serial}").write_bytes(b"seen")
        t0 = next(self.clock) * 10**10
        arrivals = tuple(t0 + (k + 1) * (10**8 + serial * 10**5) for k in range(GEN))
        return Timed(
            body, t0, tuple(range(GEN)), arrivals, tuple((k,) for k in range(GEN)), {"event": "done"}
        )


def test_measure_settles_each_block_after_its_warm_up_and_before_its_first_timed_request(
    tmp_path, monkeypatch
):
    quiet = box.Usage(window_s=1.0, other_cores=0.0, own_cores=1.0, top=())
    monkeypatch.setattr(box, "wait_until_quiet", lambda *a, **kw: (quiet, 0.0))
    monkeypatch.setattr(box, "state", lambda: {})
    monkeypatch.setattr(box, "cpu_snapshot", lambda: None)
    monkeypatch.setattr(box, "usage", lambda *a, **kw: quiet)
    monkeypatch.setattr(box, "busy_reason", lambda *a, **kw: None)
    ctx = _ctx(tmp_path)
    events: list[tuple] = []
    engines: list[Engine] = []

    def launch(side: Side) -> Engine:  # as served_model._launcher: the side folder, emptied, then the engine
        _, root = serve_dirs(ctx, side)
        events.append(("launch", side))
        engines.append(Engine(side, root, events))
        return engines[-1]

    def settled(procs: dict) -> None:
        assert set(procs) == {Side.BASE, Side.HEAD} and all(p.frozen for p in procs.values())
        events.append(("settled",))
        keep_compiles(ctx, procs)

    contexts = (Context(16, True, True), Context(32, True, True))
    m = Measurement(GEN, 0, 1e-9, 2, 2, 10**6, pairs_per_block=1, min_blocks=2, warm_requests=1)
    profile = Profile("t", "cpu", contexts, m, (), Quiet())
    prompts = ab_samples.Prompts(lambda ctx_len, serial: [serial] * ctx_len)
    run, last = abtest.measure(profile, launch, prompts, lambda _m: None, settled=settled)  # type: ignore[arg-type]
    ab_block.close(last)
    assert run.blocks == 2
    starts = [i for i, e in enumerate(events) if e == ("launch", Side.BASE)]
    assert len(starts) == 2
    timed_prompts = {s.prompt[0] for s in run.samples}
    for b, (lo, hi) in enumerate(itertools.pairwise([*starts, len(events)])):
        block = events[lo:hi]
        assert block.count(("settled",)) == 1  # once per block
        cut = block.index(("settled",))
        before = [e[2] for e in block[:cut] if e[0] == "request"]
        after = [e[2] for e in block[cut:] if e[0] == "request"]
        assert len(before) == 2 * 2 and len(after) == 2 * 2  # warm: a request per context and side
        assert not set(before) & timed_prompts  # every request before it was a warm-up...
        assert set(after) <= timed_prompts  # ...and every timed request came after it
        assert {s.prompt[0] for s in run.samples if s.block == b} == set(after)
    # the kept compile: the first block's compile and warm-up, none of its timed prompts
    first_block = {e[2] for e in events[starts[0] : starts[1]] if e[0] == "request"}
    warm1 = sorted(first_block - timed_prompts)
    assert [e for e in events if e[0] == "compile"] == [("compile", Side.BASE), ("compile", Side.HEAD)]
    second = engines[2:]
    assert {e.side for e in second} == {Side.BASE, Side.HEAD}
    for e in second:
        assert e.found == {"kernel.bin": b"compiled", **{f"memo-{s}": b"seen" for s in warm1}}


def test_a_cache_of_too_many_entries_is_not_kept(tmp_path, monkeypatch):
    # a million empty files would be copied again at every start of the side: refused like a large cache
    cache = tmp_path / "caches"
    cache.mkdir()
    for i in range(30):
        (cache / f"f{i}").touch()
    assert compile_cache.tree_bytes(cache, 1 << 20, max_entries=30) == 0
    assert compile_cache.tree_bytes(cache, 1 << 20, max_entries=29) is None
    monkeypatch.setattr(compile_cache, "MAX_ENTRIES", 29)
    why = compile_cache.snapshot(cache, tmp_path / "kept", max_bytes=1 << 20)
    assert why is not None and "entries" in why and not (tmp_path / "kept").exists()
