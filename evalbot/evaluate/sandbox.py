"""Run untrusted PR code under bubblewrap: read-only binds, one writable scratch dir, no network, rlimits.

Every run, sandboxed or not, gets a scrubbed environment, a wall-clock timeout that kills the whole
process tree, and a cap on the output it may hand back. Nothing here reads the environment at import.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_ALLOW = frozenset(
    [
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "TZ",
        "PYTHONHASHSEED",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "TRITON_CACHE_DIR",
        "XDG_CACHE_HOME",
    ]
)
# Checked against the upper-cased name, and applied even to allowlisted names: a secret never crosses.
DENY_PATTERNS = tuple(
    ["*TOKEN*", "*KEY*", "*SECRET*", "*PASSWORD*", "*CREDENTIAL*", "GITHUB_*", "EVALBOT_*", "AWS_*"]
)
# Enough of the host for a dynamically linked interpreter. /etc is bound file by file because it may
# hold the bot's own configuration.
SYSTEM_PATHS = tuple(
    [
        "/usr",
        "/bin",
        "/sbin",
        "/lib",
        "/lib32",
        "/lib64",
        "/etc/ld.so.cache",
        "/etc/ld.so.conf",
        "/etc/ld.so.conf.d",
        "/etc/alternatives",
        "/etc/passwd",
        "/etc/group",
        "/etc/nsswitch.conf",
        "/etc/localtime",
    ]
)
SITE_DIR_NAMES = ("site-packages", "dist-packages")
GPU_DEVICE_GLOBS = ("/dev/nvidia*", "/dev/nvidia-caps/*", "/dev/dri/*")

_DRAIN_GRACE_S = 2.0  # after a kill, how long to wait for pipes held open by escaped processes
_READ_CHUNK = 1 << 16


class SandboxUnavailable(RuntimeError):
    """bubblewrap (or prlimit) is missing or does not work here, so untrusted code will not run."""


@dataclass(frozen=True)
class Limits:
    """Resource limits for one run; None means no limit of that kind."""

    cpu_seconds: int = 1800
    # RLIMIT_AS counts reserved address space, not resident memory, and CUDA reserves plenty: keep GPU
    # runs' limit generous (torch 2.11 + CUDA 13 on an H200 started fine under 48 GiB).
    memory_bytes: int | None = None
    max_output_bytes: int = 16 << 20  # per stream
    timeout_s: float = 1800.0
    # RLIMIT_NPROC counts every process of the real uid and root is exempt: a backstop, not a guarantee.
    max_processes: int | None = None
    tmp_bytes: int = 1 << 30  # size of the sandbox's in-memory /tmp, which RLIMIT_AS does not cover

    def __post_init__(self) -> None:
        for name in (
            "cpu_seconds",
            "memory_bytes",
            "max_output_bytes",
            "timeout_s",
            "max_processes",
            "tmp_bytes",
        ):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not value > 0):
                raise ValueError(f"Limits.{name} must be positive, got {value!r}")


@dataclass(frozen=True)
class SandboxSpec:
    """What a sandboxed process sees: read-only binds, one writable scratch dir, its env and limits.

    `workdir` is a host path (inside scratch or a read-only bind). `scratch_at`, where given, is the path
    the scratch has inside the sandbox (the engine's env then names that path: `inside`); by default the
    scratch keeps its host path. Unsandboxed, a process sees host paths whatever scratch_at says."""

    ro_binds: tuple[Path, ...]
    scratch: Path
    workdir: Path
    env: Mapping[str, str]
    limits: Limits = field(default_factory=Limits)
    network: bool = False
    devices: tuple[str, ...] = ()
    scratch_at: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ro_binds", tuple(Path(p) for p in self.ro_binds))
        object.__setattr__(self, "scratch", Path(self.scratch))
        object.__setattr__(self, "workdir", Path(self.workdir))
        object.__setattr__(self, "devices", tuple(str(d) for d in self.devices))
        object.__setattr__(self, "env", dict(self.env))
        if self.scratch_at is not None:
            object.__setattr__(self, "scratch_at", Path(self.scratch_at))
            self._check_mount_point(self.scratch_at)
        for p in (*self.ro_binds, self.scratch, self.workdir):
            if not p.is_absolute():
                raise ValueError(f"sandbox paths must be absolute: {p}")
        if Path("/") in (*self.ro_binds, self.scratch):
            raise ValueError("binding / would expose the whole host, the bot's secrets included")
        for d in self.devices:
            if not d.startswith("/dev/"):
                raise ValueError(f"devices must lie under /dev: {d}")
        if not any(self.workdir.is_relative_to(p) for p in (self.scratch, *self.ro_binds)):
            raise ValueError(f"workdir {self.workdir} is not inside scratch or a read-only bind")
        leaked = sorted(k for k in self.env if is_secret_name(k))
        if leaked:
            raise ValueError(
                f"refusing to pass secret-looking variables into the sandbox: {', '.join(leaked)}"
            )

    def _check_mount_point(self, at: Path) -> None:
        if not at.is_absolute() or ".." in at.parts or len(at.parts) < 2:
            raise ValueError(
                f"the scratch's path inside the sandbox must be an absolute folder below /: {at}"
            )
        mounts = (*self.ro_binds, *(Path(d) for d in self.devices), Path("/tmp"), Path("/proc"), Path("/dev"))
        for p in (Path(os.path.normpath(m)) for m in mounts):  # a bind named through `..` is where it lands
            if at.is_relative_to(p) or p.is_relative_to(at):
                raise ValueError(f"the scratch's path inside the sandbox, {at}, overlaps the mount {p}")

    def inside(self, path: Path) -> Path:
        """A host path as the sandboxed process sees it: under scratch_at where it lies in the scratch."""
        path = Path(path)
        if self.scratch_at is None or not path.is_relative_to(self.scratch):
            return path
        return self.scratch_at / path.relative_to(self.scratch)


@dataclass(frozen=True)
class RunResult:
    """How a run ended and what it printed (each stream capped at Limits.max_output_bytes)."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    output_truncated: bool
    duration_s: float
    argv: tuple[str, ...]
    sandboxed: bool

    @property
    def ok(self) -> bool:
        """Exited 0 within the time limit."""
        return self.returncode == 0 and not self.timed_out


# ---------------------------------------------------------------- pure decisions


def is_secret_name(name: str) -> bool:
    """True for an env var name that looks like it carries a credential."""
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern) for pattern in DENY_PATTERNS)


def scrub_env(env: Mapping[str, str], allow: Iterable[str] = DEFAULT_ALLOW) -> dict[str, str]:
    """Only the allowlisted variables of env, and never a secret-looking one."""
    allowed = set(allow)
    return {k: v for k, v in env.items() if k in allowed and not is_secret_name(k)}


def limit_argv(limits: Limits, prlimit: str = "prlimit") -> list[str]:
    """A prlimit(1) prefix that applies limits to the command after it."""
    argv = [prlimit, f"--cpu={limits.cpu_seconds}", "--core=0"]
    if limits.memory_bytes is not None:
        argv.append(f"--as={limits.memory_bytes}")
    if limits.max_processes is not None:
        argv.append(f"--nproc={limits.max_processes}")
    return [*argv, "--"]


def bwrap_argv(
    spec: SandboxSpec, argv: Sequence[str], *, bwrap: str = "bwrap", prlimit: str = "prlimit"
) -> list[str]:
    """The full command line that runs argv inside the sandbox that spec describes."""
    # --as-pid-1: the command itself is the namespace's pid 1, a child that bwrap waits for. With bwrap's
    # own init in between, that init outlived the command, was reparented to the host's init and took
    # the command's CPU time with it, so the quiet-box check counted our own engine as another process.
    # When the command exits the kernel kills whatever is left in its namespace, as before.
    out = [bwrap, "--die-with-parent", "--new-session", "--unshare-all", "--as-pid-1"]
    if spec.network:
        out.append("--share-net")
    out += ["--cap-drop", "ALL", "--hostname", "sandbox", "--dev", "/dev", "--proc", "/proc"]
    out += ["--size", str(spec.limits.tmp_bytes), "--tmpfs", "/tmp"]
    # Parents before children: a bind under /tmp (pytest's tmp_path) or inside another bind must be
    # mounted after the mount that would otherwise hide it.
    mounts = [(p, ["--ro-bind", str(p), str(p)]) for p in spec.ro_binds]
    at = spec.scratch_at or spec.scratch
    mounts.append((at, ["--bind", str(spec.scratch), str(at)]))
    mounts += [(Path(d), ["--dev-bind", d, d]) for d in spec.devices]
    for _, args in sorted(mounts, key=lambda m: len(m[0].parts)):
        out += args
    out += ["--remount-ro", "/", "--chdir", str(spec.inside(spec.workdir)), "--clearenv"]
    for k, v in sorted(spec.env.items()):
        out += ["--setenv", k, v]
    # prlimit runs inside, after bwrap has made the namespaces: the limits then bind only the
    # untrusted tree, and RLIMIT_NPROC counts within the new user namespace, not the host's.
    return [*out, "--", *limit_argv(spec.limits, prlimit), *argv]


# ---------------------------------------------------------------- the host


def system_ro_binds() -> tuple[Path, ...]:
    """The host paths a Python process needs: system dirs that exist here, this interpreter's install, and
    every site directory on its path outside those (a venv layered on the box's venv by a .pth shares that
    venv's packages, torch among them: the builds bridge to them, so the engines must be able to read them).
    Only directories named as site directories: a checkout on the path is not shared."""
    paths = [Path(p) for p in SYSTEM_PATHS if os.path.lexists(p)]
    sites = [
        Path(p).resolve() for p in sys.path if p.rstrip("/").endswith(SITE_DIR_NAMES) and os.path.isdir(p)
    ]
    for extra in (Path(sys.base_prefix).resolve(), *sites):
        if not any(extra.is_relative_to(p) for p in paths):
            paths.append(extra)
    return tuple(paths)


def gpu_devices() -> tuple[str, ...]:
    """The GPU device nodes on this host (/dev/nvidia*, ...), for SandboxSpec.devices."""
    found: list[str] = []
    for pattern in GPU_DEVICE_GLOBS:
        parent, glob = pattern.rsplit("/", 1)
        if os.path.isdir(parent):
            found += sorted(str(p) for p in Path(parent).glob(glob) if not p.is_dir())
    return tuple(found)


@functools.cache
def sandbox_available() -> bool:
    """bwrap and prlimit exist and bwrap can actually create its namespaces here (cached)."""
    bwrap, prlimit = shutil.which("bwrap"), shutil.which("prlimit")
    if not bwrap or not prlimit:
        return False
    probe = [
        bwrap,
        *[
            "--die-with-parent",
            "--unshare-all",
            "--ro-bind",
            "/",
            "/",
            "--size",
            "1048576",
            "--tmpfs",
            "/tmp",
            "--",
        ],
    ]
    probe += [prlimit, "--core=0", "--", "true"]
    try:
        return (
            subprocess.run(probe, stdin=subprocess.DEVNULL, capture_output=True, timeout=20).returncode == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


def _require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise SandboxUnavailable(f"{tool} is not installed; it is needed to run engine code within limits")
    return path


def confined_argv(spec: SandboxSpec, argv: Sequence[str], *, no_sandbox: bool = False) -> list[str]:
    """The command line that runs argv under spec: bubblewrap and prlimit, or prlimit alone (no_sandbox)."""
    if no_sandbox:
        return [*limit_argv(spec.limits, _require("prlimit")), *argv]
    if not sandbox_available():
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is missing or cannot create namespaces here, so untrusted code will not run; "
            "install bubblewrap (and allow unprivileged user namespaces), or pass --no-sandbox explicitly "
            "to run the PR's code unconfined"
        )
    return bwrap_argv(spec, argv, bwrap=_require("bwrap"), prlimit=_require("prlimit"))


def spawn(
    spec: SandboxSpec,
    argv: Sequence[str],
    *,
    no_sandbox: bool = False,
    prefix: Sequence[str] = (),
    stdout: int = subprocess.PIPE,
) -> subprocess.Popen[bytes]:
    """Start argv confined as run() does, but long-lived: stdin and stderr are pipes, stdout a pipe or the
    file descriptor given, and the process leads its own session (kill_tree ends it and everything it
    started). `prefix` is a trusted command that runs first, outside the sandbox, and execs the rest (the
    harness's cgroup entry)."""
    full = [*prefix, *confined_argv(spec, argv, no_sandbox=no_sandbox)]
    return subprocess.Popen(
        full,
        stdin=subprocess.PIPE,
        stdout=stdout,
        stderr=subprocess.PIPE,
        env=dict(spec.env),
        cwd=spec.workdir if no_sandbox else spec.scratch,
        start_new_session=True,
    )


def kill_tree(pid: int) -> None:
    """SIGKILL a spawned process's group (under bubblewrap that ends the whole sandbox)."""
    _kill_group(pid)


def run(spec: SandboxSpec, argv: Sequence[str], *, no_sandbox: bool = False) -> RunResult:
    """Run argv in the sandbox (or, only when no_sandbox is set, directly) under spec's env and limits."""
    if no_sandbox:
        # Still scrubbed, limited and timed; but the whole filesystem and the network are reachable.
        full, cwd = [*limit_argv(spec.limits, _require("prlimit")), *argv], spec.workdir
    elif not sandbox_available():
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is missing or cannot create namespaces here, so untrusted code will not run; "
            "install bubblewrap (and allow unprivileged user namespaces), or pass --no-sandbox explicitly "
            "to run the PR's code unconfined"
        )
    else:
        # bwrap itself gets only the scrubbed env too: --clearenv covers the child, not bwrap.
        full, cwd = bwrap_argv(spec, argv, bwrap=_require("bwrap"), prlimit=_require("prlimit")), spec.scratch
    return _execute(
        full,
        env=spec.env,
        cwd=cwd,
        timeout_s=spec.limits.timeout_s,
        max_output_bytes=spec.limits.max_output_bytes,
        sandboxed=not no_sandbox,
    )


def run_trusted(
    argv: Sequence[str],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    max_output_bytes: int = 64 << 20,
) -> RunResult:
    """Run a trusted tool (git, nvidia-smi, the base's model fetch) with a timeout and capped output only."""
    return _execute(
        list(argv),
        env=dict(os.environ if env is None else env),
        cwd=cwd,
        timeout_s=timeout_s,
        max_output_bytes=max_output_bytes,
        sandboxed=False,
    )


# ---------------------------------------------------------------- process plumbing


def _execute(
    argv: list[str],
    *,
    env: Mapping[str, str],
    cwd: Path | None,
    timeout_s: float,
    max_output_bytes: int,
    sandboxed: bool,
) -> RunResult:
    start = time.monotonic()
    try:
        # A new session makes the child a process-group leader, so a timeout can kill its whole tree.
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        message = f"cannot execute {argv[0]}: {exc}"
        return RunResult(127, "", message, False, False, time.monotonic() - start, tuple(argv), sandboxed)
    try:
        out, err, timed_out, truncated = _collect(proc, start + timeout_s, max_output_bytes)
    finally:
        _kill_group(proc.pid)
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    return RunResult(
        returncode=proc.returncode,
        stdout=out.decode("utf-8", errors="replace"),
        stderr=err.decode("utf-8", errors="replace"),
        timed_out=timed_out,
        output_truncated=truncated,
        duration_s=time.monotonic() - start,
        argv=tuple(argv),
        sandboxed=sandboxed,
    )


def _collect(proc: subprocess.Popen[bytes], deadline: float, cap: int) -> tuple[bytes, bytes, bool, bool]:
    """Read both pipes as they fill, keep at most cap bytes of each, and stop the tree at the deadline."""
    assert proc.stdout is not None and proc.stderr is not None
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    open_fds = set(bufs)
    truncated = timed_out = leader_done = False
    pidfd = _pidfd(proc.pid)
    with selectors.DefaultSelector() as sel:
        for fd in bufs:
            sel.register(fd, selectors.EVENT_READ)
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ)
        try:
            while open_fds or not leader_done:
                now = time.monotonic()
                if now >= deadline:
                    if timed_out or leader_done or truncated:
                        break  # a process that escaped the group still holds a pipe: stop waiting for it
                    timed_out = True
                    _kill_group(proc.pid)
                    deadline = now + _DRAIN_GRACE_S
                # Without a pidfd, wake up now and then to notice the leader's exit.
                wait = deadline - now if pidfd is not None else min(deadline - now, 0.05)
                for key, _ in sel.select(timeout=wait):
                    if key.fd == pidfd:
                        sel.unregister(pidfd)
                        leader_done = True
                        continue
                    chunk = os.read(key.fd, _READ_CHUNK)
                    if not chunk:
                        sel.unregister(key.fd)
                        open_fds.discard(key.fd)
                        continue
                    buf = bufs[key.fd]
                    room = cap - len(buf)
                    if len(chunk) > room and not truncated:
                        # past the cap the run is stopped, not drained until its time limit: a head that
                        # floods forever must not hold the box for run_timeout_s
                        truncated = True
                        _kill_group(proc.pid)
                        deadline = min(deadline, time.monotonic() + _DRAIN_GRACE_S)
                    buf += chunk[: max(room, 0)]
                if pidfd is None and not leader_done:
                    leader_done = _exited(proc.pid)
                if leader_done and open_fds and not timed_out:
                    # The leader is done: stop any stragglers, then read what is left in the pipes.
                    _kill_group(proc.pid)
                    deadline = min(deadline, time.monotonic() + _DRAIN_GRACE_S)
        finally:
            if pidfd is not None:
                os.close(pidfd)
    return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]), timed_out, truncated


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux, or a kernel older than 5.3
        return None


def _exited(pid: int) -> bool:
    # WNOWAIT: notice the exit without reaping, so the pid (and process-group id) stays ours.
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _kill_group(pgid: int) -> None:
    # Under bwrap the group holds bwrap alone (--new-session moves the sandbox to its own session);
    # killing bwrap kills the sandbox's pid 1 (--die-with-parent), and with it the whole pid namespace.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
