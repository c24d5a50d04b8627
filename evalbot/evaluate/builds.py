"""Build one checked-out revision (evalbot.evaluate.checkout) into its own cached venv.

Venv strategy: one venv per (tree sha, toolchain). It is made with ``python -m venv
--system-site-packages`` from the bot's interpreter, and the tree is installed into it with ``pip install
--no-deps --no-build-isolation --no-index`` from a copy of the tree. The install is not editable, so the
venv is a self-contained build of that tree, and nothing done to a checkout later changes what runs.
Third-party packages (torch, gguf, tokenizers, setuptools) are shared from the bot's venv instead of being
installed per revision, which would take minutes and gigabytes. What follows from that:

- ``--system-site-packages`` exposes the *base* interpreter's site-packages, not a venv's. So when the
  given interpreter is itself a venv, a ``.pth`` file adds that venv's site directories, and any other
  site directory on its path (a venv layered on a venv, as the eval workflow does on a box whose Python
  is a venv). They are added as plain paths so that its own ``.pth`` hooks do not run: an editable
  install of the bot's checkout must not put main's ``engine`` on the path.
- A revision that needs a new third-party package fails to build: its build backend cannot import a new
  build requirement, or the smoke import (`import engine`) fails on a new runtime one. That is reported
  as the revision's 'build' failure, with the log. (A package imported only lazily fails later, at run
  time.) The caller should blame the head only when base builds with the same toolchain.
- Build requirements are not version-checked (no ``--check-build-dependencies``): main itself asks for
  ``wheel``, which modern setuptools no longer needs and the toolchain does not have.
- The cache key covers the toolchain's installed distributions, so upgrading torch in the bot's venv
  causes a rebuild rather than silently changing a cached build.

The build runs the revision's build backend (setup.py and the like), so it is untrusted code: the
caller passes ``confine``, which wraps each of the revision's steps (pip, compileall, the smoke import)
in the sandbox with the build's temp dir as the only writable place, just as the engine runs there.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import shlex
import shutil
import subprocess
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from evalbot.evaluate import sandbox
from evalbot.evaluate.checkout import Worktree
from evalbot.evaluate.exits import describe_exit
from evalbot.evaluate.files import TMP_NAME, read_json, remove, write_json_atomic
from evalbot.evaluate.files import tail as log_tail

SCHEMA = "evalbot.build/1"
MARKER = "build.json"
LOG_TAIL_LINES = 60
BUILD = "build"  # the revision's own fault
TOOLCHAIN = "toolchain"  # the environment's fault

# (argv, the build's temp dir) -> the argv that runs it confined, with that dir as the only writable place
Confine = Callable[[list[str], Path], list[str]]
TREE = "tree"  # in a built venv: the revision's tree as its build commands left it (engine.yaml's {tree})

_BRIDGE_PTH = "_evalbot_toolchain.pth"
_PROBE_TIMEOUT_S = 60.0

# Runs under the given interpreter with -I. It reports the identity of the toolchain and the site
# directories that a venv made from it must also see.
_PROBE = """\
import importlib.metadata as md, json, platform, site, sys
print(json.dumps({
    "version": platform.python_version(),
    "implementation": sys.implementation.name,
    "executable": sys.executable,
    "prefix": sys.prefix,
    "base_prefix": sys.base_prefix,
    # every site directory on its path, in its order (a venv layered on another venv by a .pth, as on a
    # box whose Python is itself a venv, shares both), then its own. Only directories named as site
    # directories: a checkout an older editable install put on the path must not reach a build.
    "site_packages": list(dict.fromkeys([
        p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))
    ] + site.getsitepackages())),
    "distributions": sorted({f"{d.metadata['Name']}=={d.version}" for d in md.distributions()}),
}))
"""


@dataclass(frozen=True)
class BuildResult:
    """The outcome of build_env(); on failure, failure_stage says whose fault it is ('build' or 'toolchain')."""

    ok: bool
    venv: Path | None
    cached: bool
    log_path: Path
    failure_stage: str | None
    message: str
    log_tail: str
    python_version: str | None = None
    key_sha256: str | None = None

    @property
    def python(self) -> Path | None:
        """The venv's interpreter, which runs the revision's engine (engine.yaml's serve argv)."""
        return None if self.venv is None else self.venv / "bin" / "python"


# ---------------------------------------------------------------- git


# ---------------------------------------------------------------- checkouts


# ---------------------------------------------------------------- builds


class _StageFailed(Exception):
    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message


def build_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment for build subprocesses: locale, PATH and HOME kept, Python/pip settings pinned."""
    kept = {k: environ[k] for k in ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "LC_CTYPE") if k in environ}
    # The revision's build must not be steered by the caller's pip config, index or PYTHONPATH.
    return kept | {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INPUT": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PYTHONNOUSERSITE": "1",
    }


def cache_key(
    tree_sha: str,
    toolchain: Mapping[str, Any],
    import_name: str | None,
    commands: Sequence[Sequence[str]] = (),
    toolchain_paths: Sequence[str] = (),
    project: str = ".",
) -> dict[str, Any]:
    """What a cached venv depends on: the tree, the interpreter's identity and the shared packages."""
    dists = "\n".join(toolchain["distributions"]).encode()
    return {
        "schema": SCHEMA,
        "tree_sha": tree_sha,
        "python": f"{toolchain['implementation']}-{toolchain['version']}",
        "interpreter": toolchain["interpreter"],
        "interpreter_resolved": toolchain["interpreter_resolved"],
        "prefix": toolchain["prefix"],
        "distributions_sha256": hashlib.sha256(dists).hexdigest(),
        "import_name": import_name,
        **({"commands": [list(c) for c in commands]} if commands else {}),
        **({"toolchain_paths": list(toolchain_paths)} if toolchain_paths else {}),
        **({"project": project} if project != "." else {}),
    }


def classify_failure(step: str, returncode: int, output: str) -> str:
    """'toolchain' when a failed step's output shows the environment at fault, else 'build'."""
    if "No space left on device" in output or f"[Errno {errno.ENOSPC}]" in output:
        return TOOLCHAIN
    if "No module named pip" in output:
        return TOOLCHAIN
    # pip turns an unhandled exception of its own into exit 2 with "ERROR: Exception:". Failures in
    # the revision's build backend come back as InstallationError (exit 1) instead.
    if step == "pip" and (returncode == 2 or "ERROR: Exception:" in output):
        return TOOLCHAIN
    return BUILD


def build_env(
    worktree: Worktree,
    cache_root: Path,
    *,
    python: str | Path,
    log_dir: Path,
    timeout_s: float,
    import_name: str | None,
    confine: Confine | None = None,
    commands: Sequence[Sequence[str]] = (),
    toolchain_paths: Sequence[str] = (),
    project: str = ".",
) -> BuildResult:
    """Build worktree into a venv under cache_root (reused when its key matches); never raises for a failed build."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"build-{worktree.sha}.log"
    deadline = time.monotonic() + timeout_s
    toolchain: dict[str, Any] | None = None
    key_sha: str | None = None
    failure: _StageFailed | None = None
    with open(log_path, "w", encoding="utf-8", errors="replace") as log:
        try:
            toolchain = _probe(python, log, deadline)
            key = cache_key(worktree.tree_sha, toolchain, import_name, commands, toolchain_paths, project)
            key_sha = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
            final = cache_root / f"{worktree.tree_sha[:16]}-{key_sha[:16]}"
            cached = _venv_intact(final, key_sha)
            if cached:
                log.write(f"reusing {final} (key {key_sha}); its build log is {final / 'build.log'}\n")
            else:
                _build(
                    worktree, final, key, key_sha, toolchain, import_name, log, deadline, confine, commands,
                    project,
                )  # fmt: skip
        except _StageFailed as f:
            failure = f
        except OSError as e:
            # Our own file work failing (disk full, permissions, a vanished directory) is the box's fault.
            what = "disk full" if e.errno == errno.ENOSPC else "file system error"
            failure = _StageFailed(TOOLCHAIN, f"{what} while building: {e}")
        if failure is not None:
            log.write(f"\nFAILED ({failure.stage}): {failure.message}\n")
    tail = log_tail(log_path, LOG_TAIL_LINES)
    version = toolchain["version"] if toolchain else None
    if failure is not None:
        return BuildResult(
            False, None, False, log_path, failure.stage, failure.message, tail, version, key_sha
        )
    message = f"reused {final}" if cached else f"built {final}"
    return BuildResult(True, final, cached, log_path, None, message, tail, version, key_sha)


def engine_identity(worktree: Worktree, build: BuildResult) -> dict[str, Any]:
    """What identifies the engine that was measured, for receipts."""
    return {
        "sha": worktree.sha,
        "tree_sha": worktree.tree_sha,
        "python": build.python_version,
        "cached": build.cached,
        "build_key": build.key_sha256,
    }


def _probe(python: str | Path, log: IO[str], deadline: float) -> dict[str, Any]:
    # A bare name ("python3") is looked up on PATH; a path is taken as given.
    found = shutil.which(python) if os.sep not in str(python) else str(python)
    if found is None or not Path(found).exists():
        raise _StageFailed(TOOLCHAIN, f"interpreter {str(python)!r} not found")
    log.write(f"$ {shlex.join([found, '-I', '-c', '<probe>'])}\n")
    try:
        proc = subprocess.run(
            [found, "-I", "-c", _PROBE],
            capture_output=True,
            text=True,
            env=build_environ(os.environ),
            stdin=subprocess.DEVNULL,
            timeout=max(0.1, min(_PROBE_TIMEOUT_S, deadline - time.monotonic())),
        )
    except subprocess.TimeoutExpired as e:
        raise _StageFailed(TOOLCHAIN, f"interpreter {found} did not answer within {e.timeout:.0f}s") from e
    except OSError as e:
        raise _StageFailed(TOOLCHAIN, f"interpreter {found} cannot be run: {e}") from e
    log.write(proc.stderr)
    if proc.returncode != 0:
        raise _StageFailed(TOOLCHAIN, f"interpreter {found} failed to start (exit {proc.returncode})")
    try:
        info = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        raise _StageFailed(TOOLCHAIN, f"interpreter {found} gave an unreadable self-description: {e}") from e
    info["interpreter"] = str(Path(found).absolute())
    info["interpreter_resolved"] = str(Path(found).resolve())
    log.write(f"toolchain: {info['implementation']} {info['version']} at {info['prefix']}\n")
    return info


def _build(
    worktree: Worktree,
    final: Path,
    key: Mapping[str, Any],
    key_sha: str,
    toolchain: Mapping[str, Any],
    import_name: str | None,
    log: IO[str],
    deadline: float,
    confine: Confine | None = None,
    commands: Sequence[Sequence[str]] = (),
    project: str = ".",
) -> None:
    cache_root = final.parent
    cache_root.mkdir(parents=True, exist_ok=True)
    _sweep_abandoned(cache_root)
    started = datetime.now(UTC)
    t0 = time.monotonic()
    tmp = cache_root / f".tmp-{final.name}-{os.getpid()}-{secrets.token_hex(4)}"
    venv, src = tmp / "venv", tmp / "src"
    # pip and the build backend put their temp files here too, so a killed build leaves nothing in /tmp.
    env = build_environ(os.environ) | {"TMPDIR": str(tmp / "tmp")}
    try:
        (tmp / "tmp").mkdir(parents=True)
        run = _Runner(log, env, cwd=tmp, deadline=deadline, confine=confine)
        run(
            "venv",
            TOOLCHAIN,
            [toolchain["interpreter"], "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        )
        vpy = str(venv / "bin" / "python")
        site_dir = Path(
            run.capture("venv", [vpy, "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
        )
        bridged = [p for p in toolchain["site_packages"] if Path(p).is_dir()]
        if toolchain["prefix"] != toolchain["base_prefix"] and bridged:
            (site_dir / _BRIDGE_PTH).write_text("".join(f"{p}\n" for p in bridged), encoding="utf-8")
            log.write(f"shared from the toolchain venv: {', '.join(bridged)}\n")

        shutil.copytree(worktree.path, src, symlinks=True)  # pip builds in tree; keep the checkout clean
        if import_name is not None:  # the Python project at `project` (engine.yaml) in the tree's copy
            _check_pyproject(src / project, log)
            run(
                "pip",
                BUILD,
                [vpy, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                 "--ignore-installed", "--no-cache-dir", "--progress-bar", "off",
                 "--no-warn-script-location", str(src / project)],
            )  # fmt: skip
            # pip byte-compiles too, but ignores syntax errors; compileall exits non-zero on them.
            run("compile", BUILD, [vpy, "-m", "compileall", "-q", str(site_dir)])
            run("smoke", BUILD, [vpy, "-I", "-c", f"import {import_name}"])
        fields = {"python": vpy, "jobs": str(os.cpu_count() or 1)}
        for i, template in enumerate(commands):  # the engine's own build (engine.yaml), in its tree's copy
            cmd = [a.format_map(fields) for a in template]
            run(
                f"command {i + 1}",
                BUILD,
                ["/bin/sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", str(src), *cmd],
            )
        if commands:
            src.rename(venv / TREE)  # what the commands built, served read-only as {tree}

        _relocate(venv, final)
        log.flush()
        shutil.copyfile(log.name, venv / "build.log")  # the log at log_path is rewritten on a cache hit
        finished = datetime.now(UTC)
        meta = {
            "schema": SCHEMA,
            "key": dict(key),
            "key_sha256": key_sha,
            "sha": worktree.sha,
            "started_at": started.isoformat(),
            "finished_at": finished.isoformat(),
            "build_s": round(time.monotonic() - t0, 3),
        }
        write_json_atomic(venv / MARKER, meta)
        _commit(venv, final, key_sha, log)
    finally:
        remove(tmp)


class _Runner:
    """Runs build steps one at a time into the log, within the build's deadline."""

    def __init__(
        self,
        log: IO[str],
        env: Mapping[str, str],
        *,
        cwd: Path,
        deadline: float,
        confine: Confine | None = None,
    ) -> None:
        self.log, self.env, self.cwd, self.deadline, self.confine = log, env, cwd, deadline, confine

    def __call__(self, step: str, blame: str, cmd: list[str]) -> None:
        """Run cmd; on failure blame `blame`, except that a 'build' step's output can shift it to the toolchain."""
        confined = self.confine is not None and blame == BUILD  # the revision's own code runs in these steps
        self.log.write(f"\n$ {shlex.join(cmd)}{'  (sandboxed)' if confined else ''}\n")
        self.log.flush()
        if confined:
            assert self.confine is not None
            cmd = self.confine(cmd, self.cwd)
        start = os.path.getsize(self.log.name)
        try:
            # A new session, so that a timeout can kill pip's build-backend children as well.
            proc = subprocess.Popen(
                cmd, cwd=self.cwd, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        except OSError as e:
            raise _StageFailed(TOOLCHAIN, f"{step} step could not start: {e}") from e
        try:
            rc = proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired as e:
            _kill_group(proc)
            raise _StageFailed(blame, f"{step} step did not finish within the build's time limit") from e
        except BaseException:
            _kill_group(proc)
            raise
        if rc != 0:
            with open(self.log.name, "rb") as f:
                f.seek(start)
                output = f.read().decode(errors="replace")
            stage = TOOLCHAIN if blame == TOOLCHAIN else classify_failure(step, rc, output)
            raise _StageFailed(stage, f"{step} step failed: it {describe_exit(rc)}")

    def capture(self, step: str, cmd: list[str]) -> str:
        """Run a toolchain query and return its stdout, stripped."""
        try:
            out = subprocess.run(
                cmd, capture_output=True, text=True, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                timeout=max(0.1, self.deadline - time.monotonic()),
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as e:
            raise _StageFailed(
                TOOLCHAIN, f"{step} step failed: the new venv's interpreter does not run: {e}"
            ) from e
        if out.returncode != 0:
            self.log.write(out.stderr)
            raise _StageFailed(TOOLCHAIN, f"{step} step failed: the new venv's interpreter does not run")
        return out.stdout.strip()


def _kill_group(proc: subprocess.Popen[Any]) -> None:
    sandbox.kill_tree(proc.pid)  # the one process-group killer (a sandboxed step is its own session)
    proc.wait()


def _check_pyproject(src: Path, log: IO[str]) -> None:
    # pip crashes with an internal error on bad TOML, which would read as the toolchain's fault.
    pyproject = src / "pyproject.toml"
    if not pyproject.is_file():
        return
    try:
        tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        log.write(f"pyproject.toml: {e}\n")
        raise _StageFailed(BUILD, f"pyproject.toml is not valid TOML: {e}") from e


def _relocate(venv: Path, final: Path) -> None:
    # Venvs hard-code their own path in script shebangs and activate scripts; we built under tmp.
    old, new = str(venv).encode(), str(final).encode()
    for path in [*sorted((venv / "bin").iterdir()), venv / "pyvenv.cfg"]:
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if old in data:
            path.write_bytes(data.replace(old, new))


def _commit(venv: Path, final: Path, key_sha: str, log: IO[str]) -> None:
    try:
        venv.rename(final)  # atomic: the entry appears complete or not at all
    except OSError:
        if _venv_intact(final, key_sha):
            log.write(f"another build of the same key finished first; using {final}\n")
            return
        remove(final)  # not a valid entry for this key: left by a crash or edited by hand
        venv.rename(final)
    log.write(f"built {final}\n")


def _venv_intact(final: Path, key_sha: str) -> bool:
    meta = read_json(final / MARKER)
    return meta is not None and meta.get("key_sha256") == key_sha and (final / "bin" / "python").exists()


def _sweep_abandoned(cache_root: Path) -> None:
    """Remove temp build dirs whose process is gone (a killed build leaves its temp dir, never an entry)."""
    for entry in cache_root.iterdir():
        m = TMP_NAME.fullmatch(entry.name)
        if m and not _pid_alive(int(m.group(1))):
            remove(entry)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True
