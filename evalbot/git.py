"""The one module that runs git: every git command of the bot (builds' checkouts and merges, the mirror,
the ledger branch, the copycat screen's view of main) goes through ``run`` or ``out``.

Each command runs as ``git -C <repo>`` with stdin closed, a timeout, no terminal prompt (a bot must never
wait on a credential question), and without the variables that would point it at another repository
(``GIT_DIR``, ``GIT_INDEX_FILE``, ... inherited from a hook, say, would override ``-C``). Text output is
decoded with ``surrogateescape``: a path that is not UTF-8 is still a path.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

DEFAULT_TIMEOUT_S = 600.0
# variables that choose which repository, index or objects git uses
_RELOCATING = frozenset(
    {
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_COMMON_DIR",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_NAMESPACE",
        "GIT_PREFIX",
        "GIT_CEILING_DIRECTORIES",
    }
)


class GitError(RuntimeError):
    """git is missing, timed out, or refused a command; the message names the command and git's answer."""


def environ(extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment git runs with: base (default os.environ) less the relocating variables, plus extra."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in _RELOCATING}
    return env | {"GIT_TERMINAL_PROMPT": "0"} | dict(extra or {})


def _argv(repo: Path | str, args: tuple[str, ...]) -> list[str]:
    return ["git", "-C", str(repo), *args]


def _show(args: tuple[str, ...]) -> str:
    return f"git {shlex.join(args[:3])}{' ...' if len(args) > 3 else ''}"


def run(
    repo: Path | str,
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    text: bool = True,
) -> subprocess.CompletedProcess[Any]:
    """Run git in repo and return what it did, whatever its exit code; GitError only if it could not run."""
    try:
        return subprocess.run(
            _argv(repo, args),
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            env=environ(env),
            text=text,
            errors="surrogateescape" if text else None,
        )
    except FileNotFoundError as exc:
        raise GitError(f"git is not installed: {exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise GitError(f"`{_show(args)}` in {repo} took longer than {timeout:g} s") from exc


def out(
    repo: Path | str, *args: str, env: Mapping[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT_S
) -> str:
    """git's standard output; GitError (with the end of its stderr) when it exits non-zero."""
    proc = run(repo, *args, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise GitError(
            f"`{_show(args)}` failed in {repo}: {proc.stderr.strip()[-500:] or f'exit {proc.returncode}'}"
        )
    return proc.stdout


def stream(repo: Path | str, *args: str) -> subprocess.Popen[bytes]:
    """Start git with its standard output as a byte stream (``git archive``); the caller waits on it."""
    try:
        return subprocess.Popen(
            _argv(repo, args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=environ(),
        )
    except FileNotFoundError as exc:
        raise GitError(f"git is not installed: {exc}") from exc


def read_stderr(proc: subprocess.Popen[bytes]) -> str:
    """The stderr of a finished ``stream`` process, decoded for a message."""
    err: IO[bytes] | None = proc.stderr
    return err.read().decode(errors="replace").strip() if err is not None else ""
