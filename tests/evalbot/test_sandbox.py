"""The sandbox holds PR code in: no network, no secrets, nothing outside its binds, bounded time and output."""

from __future__ import annotations

import ast
import os
import socket
import sys
import time
import uuid
from pathlib import Path

import pytest

from evalbot.evaluate import sandbox
from evalbot.evaluate.sandbox import Limits, SandboxSpec, SandboxUnavailable

needs_bwrap = pytest.mark.skipif(not sandbox.sandbox_available(), reason="bubblewrap cannot run here")
PY = [sys.executable, "-I", "-S", "-c"]  # -S: no site import, so the interpreter starts fast


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    path = tmp_path / "scratch"
    path.mkdir()
    return path


def make_spec(scratch: Path, *, ro: tuple[Path, ...] = (), env: dict | None = None, **limits) -> SandboxSpec:
    binds = (*sandbox.system_ro_binds(), Path(sys.prefix), *ro)
    base_env = {"PATH": "/usr/bin:/bin", "HOME": str(scratch), "LANG": "C.UTF-8"}
    return SandboxSpec(
        ro_binds=binds,
        scratch=scratch,
        workdir=scratch,
        env=env or base_env,
        limits=Limits(**{"timeout_s": 20.0, "cpu_seconds": 20, **limits}),
    )


def running_with(marker: str) -> list[int]:
    """Host pids whose command line holds marker."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def wait_until_gone(marker: str, within_s: float = 3.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := running_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


# ---------------------------------------------------------------- pure parts


def test_scrub_env_keeps_the_allowlist_and_drops_secrets():
    env = {
        "PATH": "/usr/bin",
        "LANG": "C",
        "GITHUB_TOKEN": "t",
        "EVALBOT_SIGNING_KEY": "k",
        "MY_API_KEY": "k",
        "AWS_REGION": "x",
        "LD_PRELOAD": "/evil.so",
        "PYTHONPATH": "/pr",
        "TORCH_NUM_SPLITS": "4",
    }
    assert sandbox.scrub_env(env) == {"PATH": "/usr/bin", "LANG": "C"}


def test_scrub_env_drops_secrets_even_when_allowlisted():
    env = {"HF_TOKEN": "t", "db_password": "p", "GITHUB_SHA": "abc", "HOME": "/h"}
    assert sandbox.scrub_env(env, allow=env) == {"HOME": "/h"}


def test_spec_refuses_secret_looking_env(scratch):
    with pytest.raises(ValueError, match="GITHUB_TOKEN"):
        make_spec(scratch, env={"PATH": "/usr/bin", "GITHUB_TOKEN": "t"})


def test_spec_refuses_binding_root(scratch):
    with pytest.raises(ValueError, match="whole host"):
        SandboxSpec(ro_binds=(Path("/"),), scratch=scratch, workdir=scratch, env={})


def test_bwrap_argv_shape(tmp_path):
    spec = SandboxSpec(
        ro_binds=(Path("/usr"), tmp_path / "wt" / "venv", tmp_path / "wt"),
        scratch=tmp_path / "s",
        workdir=tmp_path / "s",
        env={"PATH": "/usr/bin"},
        limits=Limits(cpu_seconds=60, memory_bytes=1 << 30, timeout_s=10),
        devices=("/dev/nvidia0",),
    )
    argv = sandbox.bwrap_argv(spec, ["python", "-m", "engine"])
    assert argv[:4] == ["bwrap", "--die-with-parent", "--new-session", "--unshare-all"]
    assert "--share-net" not in argv and argv[argv.index("--cap-drop") + 1] == "ALL"
    # /tmp's tmpfs first, then parents before children, so no mount hides another
    order = [argv.index(x) for x in ("/tmp", str(tmp_path / "wt"), str(tmp_path / "wt" / "venv"))]
    assert order == sorted(order)
    assert argv[argv.index("--dev-bind") + 1] == "/dev/nvidia0"
    assert argv[argv.index("--clearenv") + 1 : argv.index("--clearenv") + 4] == [
        "--setenv",
        "PATH",
        "/usr/bin",
    ]
    sep = argv.index("--")
    assert argv[sep + 1 :] == [
        "prlimit",
        "--cpu=60",
        "--core=0",
        f"--as={1 << 30}",
        "--",
        "python",
        "-m",
        "engine",
    ]
    net = SandboxSpec(spec.ro_binds, spec.scratch, spec.workdir, spec.env, spec.limits, network=True)
    assert "--share-net" in sandbox.bwrap_argv(net, ["true"])


def test_unavailable_sandbox_refuses_to_run(scratch, monkeypatch):
    monkeypatch.setattr(
        sandbox.shutil, "which", lambda name, *a, **k: None if name == "bwrap" else "/usr/bin/" + name
    )
    sandbox.sandbox_available.cache_clear()
    try:
        assert sandbox.sandbox_available() is False
        with pytest.raises(SandboxUnavailable, match=r"untrusted code will not run.*--no-sandbox"):
            sandbox.run(make_spec(scratch), ["true"])
    finally:
        sandbox.sandbox_available.cache_clear()


# ---------------------------------------------------------------- unsandboxed runs (only what it still promises)


def test_no_sandbox_runs_directly_with_scrubbed_env(scratch, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_secret")
    res = sandbox.run(
        make_spec(scratch),
        [*PY, "import os; print(os.environ.get('GITHUB_TOKEN'), os.getcwd())"],
        no_sandbox=True,
    )
    assert res.ok and res.sandboxed is False
    assert res.stdout.split() == ["None", str(scratch)]


def test_no_sandbox_timeout_kills_the_tree(scratch):
    marker = f"61.{uuid.uuid4().int % 10**9}"
    t0 = time.monotonic()
    res = sandbox.run(
        make_spec(scratch, timeout_s=0.5), ["sh", "-c", f"sleep {marker} & sleep {marker}"], no_sandbox=True
    )
    assert res.timed_out and time.monotonic() - t0 < 5
    assert wait_until_gone(marker) == []


def test_no_sandbox_stragglers_do_not_outlive_the_leader(scratch):
    marker = f"62.{uuid.uuid4().int % 10**9}"
    res = sandbox.run(make_spec(scratch), ["sh", "-c", f"sleep {marker} & echo done"], no_sandbox=True)
    assert res.ok and not res.timed_out and res.stdout == "done\n" and res.duration_s < 5
    assert wait_until_gone(marker) == []


def test_missing_program_is_a_result_not_a_crash():
    res = sandbox.run_trusted(["/nonexistent/nvidia-smi"], timeout_s=5)
    assert res.returncode == 127 and "cannot execute" in res.stderr


def test_output_is_capped_and_decoded_leniently():
    code = "import sys; sys.stdout.buffer.write(b'\\xff' + b'x' * 10_000_000); sys.stderr.write('tail')"
    res = sandbox.run_trusted([*PY, code], timeout_s=20, max_output_bytes=1000)
    assert res.output_truncated and not res.timed_out and res.returncode != 0  # stopped at the cap
    assert len(res.stdout) == 1000 and res.stdout.startswith("\ufffdxxx")


def test_a_run_that_floods_forever_is_stopped_at_the_cap_not_the_time_limit():
    code = "import sys\nwhile True: sys.stdout.write('x' * 65536)"
    t0 = time.monotonic()
    res = sandbox.run_trusted([*PY, code], timeout_s=60, max_output_bytes=1 << 20)
    assert res.output_truncated and not res.timed_out and len(res.stdout) == 1 << 20
    assert time.monotonic() - t0 < 10


# ---------------------------------------------------------------- sandboxed runs


@needs_bwrap
def test_network_is_unreachable(scratch):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = (
            f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')"
        )
        res = sandbox.run(make_spec(scratch), [*PY, code])
        assert (
            sandbox.run(make_spec(scratch), [*PY, code], no_sandbox=True).stdout == "connected\n"
        )  # the probe works
    assert res.returncode != 0 and "connected" not in res.stdout
    assert "ConnectionRefusedError" in res.stderr  # the sandbox's own loopback has nothing listening
    assert res.sandboxed


@needs_bwrap
def test_env_is_scrubbed_inside(scratch, monkeypatch):
    for name in ("GITHUB_TOKEN", "EVALBOT_SIGNING_KEY", "MY_API_KEY"):
        monkeypatch.setenv(name, "secret-value")
    env = {**sandbox.scrub_env(os.environ), "HOME": str(scratch)}
    res = sandbox.run(make_spec(scratch, env=env), [*PY, "import os; print(sorted(os.environ))"])
    assert res.ok, res.stderr
    seen = ast.literal_eval(res.stdout)
    assert "PATH" in seen and "HOME" in seen
    assert not {"GITHUB_TOKEN", "EVALBOT_SIGNING_KEY", "MY_API_KEY"} & set(seen)


@needs_bwrap
def test_files_outside_the_binds_are_invisible(tmp_path, scratch):
    (tmp_path / "state").mkdir()
    secret = tmp_path / "state" / "signing.key"
    secret.write_text("PRIVATE")
    res = sandbox.run(make_spec(scratch), ["cat", str(secret)])
    assert res.returncode != 0 and "PRIVATE" not in res.stdout
    assert "No such file" in res.stderr


@needs_bwrap
def test_ro_bind_is_read_only_and_scratch_is_writable(tmp_path, scratch):
    worktree = tmp_path / "worktree"
    worktree.mkdir()
    (worktree / "engine.py").write_text("print('engine')")
    script = (
        f"cat {worktree}/engine.py; echo x > {worktree}/pwned; echo y > {scratch}/out; echo z > /etc/pwned"
    )
    res = sandbox.run(make_spec(scratch, ro=(worktree,)), ["sh", "-c", script])
    assert res.stdout == "print('engine')"
    assert res.stderr.count("Read-only file system") == 2
    assert not (worktree / "pwned").exists()
    assert (scratch / "out").read_text() == "y\n"


@needs_bwrap
def test_timeout_kills_the_sandbox_and_its_children(scratch):
    marker = f"63.{uuid.uuid4().int % 10**9}"
    t0 = time.monotonic()
    res = sandbox.run(make_spec(scratch, timeout_s=0.5), ["sh", "-c", f"sleep {marker} & sleep {marker}"])
    assert res.timed_out and res.returncode != 0
    assert time.monotonic() - t0 < 5
    assert wait_until_gone(marker) == []


@needs_bwrap
def test_output_cap_in_the_sandbox(scratch):
    code = "import sys; sys.stdout.write('x' * 10_000_000)"
    res = sandbox.run(make_spec(scratch, max_output_bytes=4096), [*PY, code])
    assert res.output_truncated and not res.ok and len(res.stdout) == 4096


@needs_bwrap
def test_memory_limit_stops_a_big_allocation(scratch):
    code = "b = bytearray(2 << 30); print('allocated')"
    res = sandbox.run(make_spec(scratch, memory_bytes=512 << 20), [*PY, code])
    assert res.returncode != 0 and "MemoryError" in res.stderr and "allocated" not in res.stdout


@needs_bwrap
def test_cpu_limit_kills_a_spinner(scratch):
    res = sandbox.run(make_spec(scratch, cpu_seconds=1), [*PY, "while True: pass"])
    assert not res.timed_out and res.returncode != 0  # SIGKILL/SIGXCPU at the rlimit, long before the timeout


def test_site_directories_on_the_path_are_readable_but_not_a_checkout(tmp_path, monkeypatch):
    """A harness venv layered on the box's venv by a .pth (a GPU box whose torch lives in a venv): the
    builds reach that venv's site directory, so the sandbox must bind it. A plain directory on the path
    (a checkout an old editable install added) is not bound."""
    layered = tmp_path / "box-venv" / "lib" / "python3" / "site-packages"
    layered.mkdir(parents=True)
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(layered), str(checkout)])
    binds = sandbox.system_ro_binds()
    assert layered.resolve() in binds
    assert not any(checkout.resolve().is_relative_to(b) for b in binds if b != Path("/"))


def test_scratch_at_must_be_a_folder_apart_from_every_other_mount(scratch):
    spec = make_spec(scratch)
    for bad in ("/", "relative/side", "/usr/side", "/tmp/side", "/proc/x", "/a/../usr"):
        with pytest.raises(ValueError, match="inside the sandbox"):
            SandboxSpec(spec.ro_binds, scratch, scratch, spec.env, scratch_at=Path(bad))
    with pytest.raises(ValueError, match="overlaps the mount /usr"):  # a mount point above a read-only bind
        SandboxSpec(spec.ro_binds, scratch, scratch, spec.env, scratch_at=Path("/usr"))
    with pytest.raises(
        ValueError, match="overlaps the mount /evalbot/side"
    ):  # a bind that lands on it via ..
        SandboxSpec(
            (Path("/opt/../evalbot/side"),), scratch, scratch, spec.env, scratch_at=Path("/evalbot/side")
        )


def test_inside_maps_only_paths_in_the_scratch(scratch, tmp_path):
    spec = SandboxSpec((), scratch, scratch, {}, scratch_at=Path("/evalbot/side"))
    assert spec.inside(scratch / "work" / "f") == Path("/evalbot/side/work/f")
    assert spec.inside(scratch) == Path("/evalbot/side")
    assert spec.inside(tmp_path / "other") == tmp_path / "other"
    assert SandboxSpec((), scratch, scratch, {}).inside(scratch / "a") == scratch / "a"


@needs_bwrap
def test_a_scratch_mounted_elsewhere_is_the_process_s_cwd_and_its_host_path_is_not_there(scratch):
    (scratch / "work").mkdir()
    at = Path("/evalbot/side")
    base = make_spec(scratch)
    env = {**base.env, "HOME": str(at / "work")}
    spec = SandboxSpec(base.ro_binds, scratch, scratch / "work", env, base.limits, scratch_at=at)
    code = (
        f"import os, pathlib; print(os.getcwd(), os.environ['HOME'], os.path.exists({str(scratch)!r}));"
        " pathlib.Path('made').write_text('x')"
    )
    res = sandbox.run(spec, [*PY, code])
    assert res.ok, res.stderr
    assert res.stdout.split() == ["/evalbot/side/work", "/evalbot/side/work", "False"]
    assert (scratch / "work" / "made").read_text() == "x"  # written through the mount, kept on the host
