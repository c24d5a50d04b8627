"""What the steps of one evaluation share: the workspace, the run's context, and the sandbox.

The run's context (RunContext) holds what the steps learn as they go: each side's build, the models, the
scratch folder, the profile's limits. Every engine process and every build step of a revision runs in the
sandbox made here: scratch is the only writable place, the env is scrubbed, the bot's state unreadable.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalbot.evaluate import builds, checkout, sandbox
from evalbot.model import EvalRequest, Failure, Side
from evalbot.rules import Rules

Log = Callable[[str], None]


class SideFailed(Exception):
    """One engine run failed; carries the Failure to record."""

    def __init__(self, failure: Failure):
        super().__init__(failure.message)
        self.failure = failure


@dataclass(frozen=True)
class Workspace:
    """Where, and with what, evaluations run on this box: the repository holding the revisions, the work
    folder (worktrees, venvs, build logs), the trusted rules, the interpreter builds use, and a live
    progress display (stage, pairs per context, running ratio and CI, ETA). What is evaluated is the
    EvalRequest."""

    repo: Path
    work_root: Path
    rules: Rules
    python: str = sys.executable
    progress: Callable[[dict[str, Any]], None] | None = None


@dataclass
class SideBuild:
    """One side's checkout and its build."""

    side: Side
    worktree: checkout.Worktree
    build: builds.BuildResult


@dataclass
class RunContext:
    """One evaluation's state, which its steps share: the builds, the models, the scratch, the limits."""

    req: EvalRequest
    ws: Workspace
    log: Log
    scratch: Path
    ro_binds: list[Path] = field(default_factory=list)
    sides: dict[Side, SideBuild] = field(default_factory=dict)
    profile_device: str = "cpu"
    engine_threads: int | None = None  # the profile's threads per engine; None: every usable core
    run_timeout_s: float = 600.0
    max_output_bytes: int = 64 << 20
    box_samples: list[dict[str, Any]] = field(default_factory=list)
    runs: int = 0  # engine processes started, for fresh scratch names
    model_paths: dict[str, Path] = field(default_factory=dict)
    serve_scratch: dict[Side, Path] = field(default_factory=dict)  # each side's latest serving process's
    compiled: dict[Side, Path] = field(default_factory=dict)  # each side's kept first compile (compile_cache)
    compile_notes: dict[Side, str] = field(default_factory=dict)  # why a side's compile was not kept


def fresh_scratch(ctx: RunContext, label: str) -> Path:
    """A new, empty folder under the run's scratch for one engine process."""
    ctx.runs += 1
    path = ctx.scratch / "runs" / f"{ctx.runs:05d}-{label}"
    path.mkdir(parents=True)
    return path


SIDE_LABEL = {Side.BASE: "main", Side.HEAD: "the PR"}
# where a serving engine's side folder is mounted in its sandbox, for either side (`sandbox_spec`)
SIDE_MOUNT = Path("/evalbot/side")


# --- the sandbox ------------------------------------------------------------------------------------


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity: an operator who pins evaluate with taskset pins its
    engines' threads too), else every CPU of the machine."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def sandbox_spec(
    ctx: RunContext,
    venv: Path,
    scratch: Path,
    extra_binds: list[Path],
    timeout_s: float,
    side_root: Path | None = None,
) -> sandbox.SandboxSpec:
    """The sandbox of one engine process: scratch is the only writable place, the env is scrubbed.

    With `side_root` (a folder above scratch, emptied before each serving process of the side starts,
    `serve_dirs`) the process may write all of it, and its compile caches (TorchInductor, Triton, torch's
    extension builds) live in side_root/caches: one path for every process of the side, which the runner
    fills with a copy of the side's first compile (`compile_cache`). The path must stay the same: an
    extension build copied to another folder is built again (its ninja commands name the folder).

    Sandboxed, a side's root is mounted at SIDE_MOUNT, the same path for both sides: main's engine and the
    PR's see the same working folder, HOME, TMPDIR and cache paths, byte for byte, so that nothing in the
    two processes' environments differs but their code (and neither learns where the harness keeps its
    work)."""
    scratch.mkdir(parents=True, exist_ok=True)
    if side_root is not None and not scratch.is_relative_to(side_root):
        raise ValueError(f"{scratch} is not inside the side's root {side_root}")
    caches = scratch if side_root is None else side_root / "caches"
    caches.mkdir(exist_ok=True)
    at = SIDE_MOUNT if side_root is not None and not ctx.req.options.no_sandbox else None
    writable = side_root or scratch

    def inside(p: Path) -> str:
        return str(p if at is None else at / p.relative_to(writable))

    env = sandbox.scrub_env(os.environ)
    cores = str(ctx.engine_threads or usable_cores())
    env.update(
        {
            "HOME": inside(scratch),
            "TMPDIR": inside(scratch),
            "XDG_CACHE_HOME": inside(caches / ".cache"),
            "OMP_NUM_THREADS": cores,
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            "TRITON_CACHE_DIR": inside(caches / ".triton"),
            "TORCHINDUCTOR_CACHE_DIR": inside(caches / ".inductor"),
        }
    )
    return sandbox.SandboxSpec(
        ro_binds=tuple(dict.fromkeys([*ctx.ro_binds, venv, *extra_binds])),
        scratch=writable,
        workdir=scratch,
        env=env,
        limits=sandbox.Limits(
            cpu_seconds=int(timeout_s * usable_cores()),
            memory_bytes=48 << 30,
            max_output_bytes=ctx.max_output_bytes,
            timeout_s=timeout_s,
        ),
        devices=sandbox.gpu_devices() if ctx.profile_device == "cuda" else (),
        scratch_at=at,
    )


def sandboxed_python(
    ctx: RunContext, venv: Path, scratch: Path, argv: list[str], extra_binds: list[Path], timeout_s: float
) -> sandbox.RunResult:
    """`python -m argv` from a venv under bubblewrap: scratch is the only writable place, the env is scrubbed."""
    spec = sandbox_spec(ctx, venv, scratch, extra_binds, timeout_s)
    return sandbox.run(
        spec, [str(venv / "bin" / "python"), "-m", *argv], no_sandbox=ctx.req.options.no_sandbox
    )


def confine_build(argv: list[str], writable: Path, extra: Sequence[Path] = ()) -> list[str]:
    """A revision's build step under bubblewrap: no network, only its temp dir writable, no secrets; `extra`
    read-only (engine.yaml's toolchain paths, such as a CUDA toolkit)."""
    env = builds.build_environ(sandbox.scrub_env(os.environ)) | {
        "HOME": str(writable),
        "TMPDIR": str(writable / "tmp"),
    }
    spec = sandbox.SandboxSpec(
        ro_binds=tuple(ro_binds(list(extra))),
        scratch=writable,
        workdir=writable,
        env=env,
        limits=sandbox.Limits(cpu_seconds=3600, memory_bytes=16 << 30),
    )
    return sandbox.bwrap_argv(spec, argv)


def toolchain_paths(ctx: RunContext) -> list[Path]:
    """engine.yaml's toolchain: read-only paths the build and the serving engine may read."""
    return [Path(p) for p in ctx.ws.rules.engine.toolchain]


def ro_binds(model_dirs: list[Path]) -> list[Path]:
    """What sandboxed code may read: system dirs, the interpreters, the models. Never the bot's state."""
    interpreters = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}
    return list(dict.fromkeys([*sandbox.system_ro_binds(), *sorted(interpreters), *model_dirs]))
