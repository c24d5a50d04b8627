"""Checkouts and per-tree venv builds, on a throwaway git repo holding a tiny `engine` package."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evalbot.evaluate import builds
from evalbot.evaluate.builds import BUILD, TOOLCHAIN, build_env, classify_failure, engine_identity
from evalbot.evaluate.checkout import BuildError, changed_paths, cleanup_worktrees, prepare_worktree

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "tiny-engine"
version = "0.0.1"

[tool.setuptools]
packages = ["engine"]
"""
MAIN = (
    'import json\nfrom engine import VERSION\nprint(json.dumps({"schema": "tiny/1", "version": VERSION}))\n'
)


def git(repo: Path, *args: str) -> str:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(repo.parent),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def commit(repo: Path, message: str, files: dict[str, str | tuple[str] | None]) -> str:
    """Commit these files (None deletes, a 1-tuple is a symlink's target)."""
    for name, text in files.items():
        path = repo / name
        if text is None:
            path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, tuple):
            path.symlink_to(text[0])
        else:
            path.write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """main: base, then a later main-only commit; head and the broken variants branch off base."""
    repo = tmp_path_factory.mktemp("judged") / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    base = {
        "pyproject.toml": PYPROJECT,
        "engine/__init__.py": 'VERSION = "base"\n',
        "engine/__main__.py": MAIN,
    }
    commit(repo, "base", base)
    git(repo, "tag", "base")
    git(repo, "checkout", "-q", "-b", "head")
    commit(repo, "head", {"engine/__init__.py": 'VERSION = "head"\n', "engine/extra.py": "X = 1\n"})
    for branch, files in {
        "broken": {"engine/extra.py": "def oops(:\n    pass\n"},
        "bad-toml": {"pyproject.toml": "[build-system\nrequires = [\n"},
        "new-dep": {"engine/__init__.py": 'import not_a_real_dependency_xyz\nVERSION = "dep"\n'},
        "slow": {"setup.py": "import time\ntime.sleep(120)\nfrom setuptools import setup\nsetup()\n"},
        "escape": {"engine/alias.py": ("extra.py",), "engine/secret": ("/etc/hostname",)},
    }.items():
        git(repo, "checkout", "-q", "-b", branch, "head")
        commit(repo, branch, files)
    git(repo, "checkout", "-q", "main")
    commit(repo, "main moves on", {"docs/main_only.md": "later\n"})
    return repo


# ---------------------------------------------------------------- checkouts


def test_prepare_worktree_checks_out_each_revision(repo, tmp_path):
    root = tmp_path / "wt"
    base = prepare_worktree(repo, "base", root)
    head = prepare_worktree(repo, "head", root)
    assert base.sha != head.sha and base.tree_sha != head.tree_sha
    assert base.sha == git(repo, "rev-parse", "base") and len(base.sha) == 40
    assert head.tree_sha == git(repo, "rev-parse", "head^{tree}")
    assert (base.path, head.path) == (root / base.sha, root / head.sha)
    assert (base.path / "engine/__init__.py").read_text() == 'VERSION = "base"\n'
    assert (head.path / "engine/__init__.py").read_text() == 'VERSION = "head"\n'
    assert not (base.path / "engine/extra.py").exists()
    assert not (head.path / ".git").exists()  # no link back into the judged repository
    assert head.rev == "head"


def test_an_intact_checkout_is_reused_and_a_tampered_one_redone(repo, tmp_path):
    root = tmp_path / "wt"
    first = prepare_worktree(repo, "head", root)
    stamp = (first.path / "engine/__init__.py").stat().st_mtime_ns
    again = prepare_worktree(repo, git(repo, "rev-parse", "head"), root)
    assert again.path == first.path and again.sha == first.sha
    assert (again.path / "engine/__init__.py").stat().st_mtime_ns == stamp  # not rewritten

    (first.path / "engine/sneaky.py").write_text("BAD = 1\n")
    (first.path / "engine/__init__.py").write_text("edited\n")
    redone = prepare_worktree(repo, "head", root)
    assert not (redone.path / "engine/sneaky.py").exists()
    assert (redone.path / "engine/__init__.py").read_text() == 'VERSION = "head"\n'


def test_unknown_revisions_are_a_clear_build_error(repo, tmp_path):
    for rev in ["no-such-branch", "0" * 40, "--output=/tmp/x", "base:pyproject.toml"]:
        with pytest.raises(BuildError, match="unknown revision"):
            prepare_worktree(repo, rev, tmp_path / "wt")
    with pytest.raises(BuildError, match="cannot resolve 'HEAD'"):
        prepare_worktree(tmp_path / "not-a-repo", "HEAD", tmp_path / "wt")


def test_links_that_leave_the_tree_are_refused(repo, tmp_path):
    with pytest.raises(BuildError, match="cannot be checked out safely"):
        prepare_worktree(repo, "escape", tmp_path / "wt")
    assert list((tmp_path / "wt").iterdir()) == []


def test_bare_repos_and_file_url_clones_work(repo, tmp_path):
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "clone", "-q", "--bare", f"file://{repo}", str(bare)], check=True)
    wt = prepare_worktree(bare, "head", tmp_path / "wt")
    assert wt.sha == git(repo, "rev-parse", "head")
    assert (wt.path / "engine/extra.py").read_text() == "X = 1\n"
    assert changed_paths(bare, "main", "head") == ["engine/__init__.py", "engine/extra.py"]


def test_cleanup_removes_only_checkouts_not_kept(repo, tmp_path):
    root = tmp_path / "wt"
    base = prepare_worktree(repo, "base", root)
    head = prepare_worktree(repo, "head", root)
    (root / "unrelated").mkdir()
    removed = cleanup_worktrees(root, keep=[head.sha])
    assert base.path in removed and not base.path.exists()
    assert head.path.exists() and (root / "unrelated").exists()
    assert prepare_worktree(repo, "head", root).path == head.path
    assert cleanup_worktrees(tmp_path / "missing") == []


def test_changed_paths_are_against_the_merge_base(repo):
    # main's later commit (docs/main_only.md) is not the head's change.
    assert changed_paths(repo, "main", "head") == ["engine/__init__.py", "engine/extra.py"]
    assert changed_paths(repo, "main", "slow") == ["engine/__init__.py", "engine/extra.py", "setup.py"]
    assert changed_paths(repo, "head", "head") == []
    with pytest.raises(BuildError):
        changed_paths(repo, "main", "nope")


# ---------------------------------------------------------------- builds


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("venvs")


@pytest.fixture(scope="module")
def head_build(repo, cache, tmp_path_factory):
    root = tmp_path_factory.mktemp("wt")
    wt = prepare_worktree(repo, "head", root)
    t0 = time.monotonic()
    result = build_env(
        wt, cache, python=sys.executable, log_dir=root / "logs", timeout_s=300, import_name="engine"
    )
    return wt, result, time.monotonic() - t0


def entries(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir())


def test_build_makes_a_venv_that_runs_the_revisions_engine(head_build):
    wt, result, _ = head_build
    assert result.ok, result.log_tail
    assert result.failure_stage is None and not result.cached
    assert result.log_path.is_file()
    meta = json.loads((result.venv / "build.json").read_text())
    assert meta["key"]["tree_sha"] == wt.tree_sha and meta["key_sha256"] == result.key_sha256
    # Run from elsewhere, so the checkout cannot be what gets imported.
    out = subprocess.run(
        [str(result.python), "-I", "-m", "engine"], capture_output=True, text=True, cwd="/", check=True
    )
    assert json.loads(out.stdout) == {"schema": "tiny/1", "version": "head"}
    where = subprocess.run(
        [str(result.python), "-I", "-c", "import engine; print(engine.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(result.venv))
    # pip built from a copy: the checkout is untouched (no build/ or egg-info).
    assert sorted(p.name for p in wt.path.iterdir()) == ["engine", "pyproject.toml"]


def test_the_same_tree_is_reused_without_rebuilding(head_build, cache, tmp_path):
    wt, first, fresh_s = head_build
    t0 = time.monotonic()
    again = build_env(wt, cache, python=sys.executable, log_dir=tmp_path, timeout_s=300, import_name="engine")
    cached_s = time.monotonic() - t0
    assert again.ok and again.cached and again.venv == first.venv
    assert cached_s < max(1.0, fresh_s / 2), (cached_s, fresh_s)
    assert "reusing" in again.log_tail
    identity = engine_identity(wt, again)
    assert identity["sha"] == wt.sha and identity["tree_sha"] == wt.tree_sha and identity["cached"] is True
    assert identity["python"] == ".".join(map(str, sys.version_info[:3]))


def test_a_syntax_error_is_the_revisions_build_failure(repo, cache, tmp_path):
    before = entries(cache)
    # A temp dir left by a build whose process died: swept, never taken for a cache entry.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (cache / f".tmp-0123456789abcdef-0123456789abcdef-{dead.pid}-deadbeef").mkdir()
    wt = prepare_worktree(repo, "broken", tmp_path / "wt")
    result = build_env(
        wt, cache, python=sys.executable, log_dir=tmp_path / "logs", timeout_s=300, import_name="engine"
    )
    assert not result.ok and result.venv is None
    assert result.failure_stage == BUILD
    assert "compile" in result.message
    assert "SyntaxError" in result.log_tail and "extra.py" in result.log_tail
    assert "SyntaxError" in result.log_path.read_text()
    assert entries(cache) == before  # no half entry, no temp dir, the stale one swept


@pytest.mark.parametrize(
    ("branch", "message", "in_log"),
    [
        ("bad-toml", "not valid TOML", "pyproject.toml"),
        ("new-dep", "smoke", "not_a_real_dependency_xyz"),
    ],
)
def test_other_faults_of_the_revision(repo, cache, tmp_path, branch, message, in_log):
    before = entries(cache)
    wt = prepare_worktree(repo, branch, tmp_path / "wt")
    result = build_env(
        wt, cache, python=sys.executable, log_dir=tmp_path / "logs", timeout_s=300, import_name="engine"
    )
    assert (result.ok, result.failure_stage) == (False, BUILD)
    assert message in result.message and in_log in result.log_tail
    assert entries(cache) == before


def test_a_build_that_overruns_is_killed_and_leaves_nothing(repo, cache, tmp_path):
    before = entries(cache)
    wt = prepare_worktree(repo, "slow", tmp_path / "wt")
    t0 = time.monotonic()
    result = build_env(
        wt, cache, python=sys.executable, log_dir=tmp_path / "logs", timeout_s=3, import_name="engine"
    )
    assert time.monotonic() - t0 < 20
    assert (result.ok, result.failure_stage) == (False, BUILD)
    assert "time limit" in result.message
    assert entries(cache) == before


def test_a_missing_interpreter_is_the_toolchains_fault(head_build, tmp_path):
    wt, _, _ = head_build
    for python in [tmp_path / "no" / "python3", "no-such-python-xyz"]:
        result = build_env(
            wt,
            tmp_path / "venvs",
            python=python,
            log_dir=tmp_path / "logs",
            timeout_s=60,
            import_name="engine",
        )
        assert (result.ok, result.failure_stage) == (False, TOOLCHAIN)
        assert "not found" in result.message
        assert result.log_path.is_file()
    assert not (tmp_path / "venvs").exists()


def test_a_full_disk_is_the_toolchains_fault(head_build, tmp_path, monkeypatch):
    wt, _, _ = head_build

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(builds.shutil, "copytree", full)
    cache = tmp_path / "venvs"
    result = build_env(
        wt, cache, python=sys.executable, log_dir=tmp_path / "logs", timeout_s=60, import_name="engine"
    )
    assert (result.ok, result.failure_stage) == (False, TOOLCHAIN)
    assert "disk full" in result.message
    assert entries(cache) == []


@pytest.mark.parametrize(
    ("step", "rc", "output", "stage"),
    [
        ("pip", 1, "error: subprocess-exited-with-error\nerror: metadata-generation-failed", BUILD),
        ("pip", 2, "ERROR: Exception:\nTraceback (most recent call last):\n  File pip/_internal", TOOLCHAIN),
        ("pip", 1, "OSError: [Errno 28] No space left on device", TOOLCHAIN),
        ("pip", 1, "/venv/bin/python: No module named pip", TOOLCHAIN),
        ("compile", 1, "*** Error compiling 'engine/x.py'...\nSyntaxError: invalid syntax", BUILD),
        ("smoke", 1, "ModuleNotFoundError: No module named 'numpyy'", BUILD),
        ("smoke", 2, "ERROR: Exception: raised by the revision's own import", BUILD),
    ],
)
def test_classify_failure(step, rc, output, stage):
    assert classify_failure(step, rc, output) == stage


def test_build_environ_drops_the_callers_python_and_pip_settings():
    env = builds.build_environ(
        {"PATH": "/bin", "PYTHONPATH": "/evil", "PIP_INDEX_URL": "http://x", "HOME": "/h"}
    )
    assert env["PATH"] == "/bin" and env["HOME"] == "/h"
    assert "PYTHONPATH" not in env and "PIP_INDEX_URL" not in env
    assert env["PIP_CONFIG_FILE"] == os.devnull


# ---------------------------------------------------------------- the build step is untrusted

SNOOP_SETUP = """\
import os, socket
from setuptools import setup
escaped = []
for target in {targets!r}:
    try:
        with open(target, "w") as f:
            f.write("written by a PR's setup.py")
        escaped.append(target)
    except OSError:
        pass
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
    escaped.append("network")
except OSError:
    pass
secrets = sorted(k for k in os.environ if "TOKEN" in k or k.startswith("EVALBOT_"))
with open(os.path.join("engine", "_snoop.py"), "w") as f:  # installed with the package: proof it ran
    f.write("ESCAPED = %r\\nSECRETS = %r\\n" % (escaped, secrets))
setup()
"""


@pytest.mark.skipif(
    not __import__("evalbot.evaluate.sandbox", fromlist=["x"]).sandbox_available(), reason="needs bubblewrap"
)
def test_a_confined_build_cannot_write_outside_its_dir_reach_the_network_or_see_secrets(
    repo, tmp_path, monkeypatch
):
    """The revision's setup.py runs inside the sandbox: the host paths stay untouched, the connect fails."""
    import socket

    from evalbot.evaluate.context import confine_build

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    host_file = tmp_path / "host-canary.txt"
    cache_file = tmp_path / "venvs" / "planted.txt"
    setup_py = SNOOP_SETUP.format(
        targets=[str(host_file), str(cache_file), str(Path.home() / "pwned.txt")],
        port=listener.getsockname()[1],
    )
    git(repo, "checkout", "-q", "-b", "snoop", "head")
    commit(repo, "snoop", {"setup.py": setup_py})
    git(repo, "checkout", "-q", "main")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_not_for_builds")
    wt = prepare_worktree(repo, "snoop", tmp_path / "wt")
    result = build_env(
        wt,
        tmp_path / "venvs",
        python=sys.executable,
        log_dir=tmp_path / "logs",
        timeout_s=600,
        confine=confine_build,
        import_name="engine",
    )
    listener.close()
    log = result.log_path.read_text()
    assert result.ok, log[-3000:]
    assert "(sandboxed)" in log
    (snoop,) = result.venv.glob("lib/python*/site-packages/engine/_snoop.py")
    seen: dict = {}
    exec(snoop.read_text(), seen)  # what setup.py saw from inside
    assert seen["SECRETS"] == [] and "network" not in seen["ESCAPED"]
    # writes under /tmp land in the sandbox's private tmpfs (bwrap makes the bind's parents there), so
    # setup.py may believe it wrote them; the host's files are what count
    assert not host_file.exists() and not cache_file.exists() and not (Path.home() / "pwned.txt").exists()


def test_remove_worktree_removes_one_checkout_and_its_marker(repo, tmp_path):
    from evalbot.evaluate.checkout import remove_worktree

    root = tmp_path / "wt"
    base = prepare_worktree(repo, "base", root)
    head = prepare_worktree(repo, "head", root)
    assert remove_worktree(root, head.sha) and not head.path.exists()
    assert not (root / f"{head.sha}.json").exists() and base.path.exists()
    assert not remove_worktree(root, head.sha)  # already gone
    with pytest.raises(ValueError, match="sha"):
        remove_worktree(root, "../../etc")


def test_a_toolchain_venv_layered_on_a_venv_shares_both(repo, cache, tmp_path):
    """The eval workflow on a box whose Python is itself a venv: the harness venv reaches that venv's
    packages through a .pth, and a build made from the harness venv must reach them too (a fresh H100's
    torch lives in such a venv). A plain directory on the path is not shared: an old-style editable
    install of the bot's checkout must not put main's code into a build."""
    deep = tmp_path / "deep" / "lib" / "site-packages"
    (deep / "chained_pkg").mkdir(parents=True)
    (deep / "chained_pkg" / "__init__.py").write_text("WHERE = 'deep'\n")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "shadow_of_main.py").write_text("")
    outer = tmp_path / "harness-venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(outer)], check=True
    )
    outer_py = outer / "bin" / "python"
    outer_site = subprocess.run(
        [str(outer_py), "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = subprocess.run(
        [sys.executable, "-I", "-c", "import site; print('\\n'.join(site.getsitepackages()))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout  # this interpreter's pip and setuptools, as the box's venv carries torch
    Path(outer_site, "layered.pth").write_text(f"{ours}{deep}\n{checkout}\n")
    wt = prepare_worktree(repo, "head", tmp_path / "wt")
    result = build_env(wt, cache, python=str(outer_py), log_dir=tmp_path, timeout_s=300, import_name="engine")
    assert result.ok, result.log_tail

    def imports(name: str) -> bool:
        probe = subprocess.run(
            [str(result.python), "-I", "-c", f"import {name}"], capture_output=True, cwd="/"
        )
        return probe.returncode == 0

    assert imports("chained_pkg") and imports("engine")
    assert not imports("shadow_of_main")


def test_the_build_key_covers_the_declared_build_and_its_toolchain():
    """engine.yaml's build commands and toolchain paths are part of what a cached venv depends on: a changed
    command or a new toolkit path builds anew instead of reusing a build made otherwise."""
    from evalbot.evaluate.builds import cache_key

    tc = {"distributions": [], "implementation": "cpython", "version": "3.11", "interpreter": "/p",
          "interpreter_resolved": "/p", "prefix": "/"}  # fmt: skip
    plain = cache_key("t" * 40, tc, "engine")
    built = cache_key("t" * 40, tc, "engine", [["make"]])
    assert plain != built != cache_key("t" * 40, tc, "engine", [["make", "-j8"]])
    assert built != cache_key("t" * 40, tc, "engine", [["make"]], ["/usr/local/cuda"])
    assert plain == cache_key("t" * 40, tc, "engine", (), ())  # nothing declared: the key as before
