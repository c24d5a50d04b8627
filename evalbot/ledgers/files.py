"""The human-readable ledgers the bot keeps in the repository: `.github/FLAGGED.md` and
`.github/blocked-contributors.txt`.

They are written by the bot as git commits (on `LEDGER_BRANCH`, so that a ledger update never moves
main and so never forces every open PR to be measured again), and re-read by it: a maintainer may
edit either file by hand. FLAGGED.md is taken as found; blocked-contributors.txt is the export of the
store's blocklist (its one source), and a hand edit of it is read back as a block or an unblock
(`reconcile_blocked`; `book` does the I/O). Rendering, parsing and reconciling are pure;
`read_ledgers` and `commit_ledgers` are the only I/O, through git.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from evalbot import git
from evalbot.rules import is_login

FLAGGED_PATH = ".github/FLAGGED.md"
BLOCKED_PATH = ".github/blocked-contributors.txt"
LEDGER_BRANCH = "evalbot-ledgers"

_FLAGGED_HEADER = """\
# Flagged pull requests

Written by evalbot; maintainers may edit it. A row is cleared by `evalbot clear PR --reason TEXT`.

| date | PR | author | label | reason | status |
|---|---|---|---|---|---|
"""
_BLOCKED_HEADER = """\
# GitHub logins whose pull requests evalbot closes unevaluated (written by evalbot; maintainers may edit).
# One login per line; text after '#' is the reason. Remove a line, or run `evalbot unblock LOGIN`, to lift it.
"""


class LedgerError(ValueError):
    """A ledger file that cannot be read back, with the line that is wrong."""


@dataclass(frozen=True)
class FlagEntry:
    """One flagged PR: when, who, which label, why, and whether a maintainer cleared it."""

    date: str
    pr: int
    author: str
    label: str
    reason: str
    status: str = "open"  # "open" or "cleared by LOGIN: reason"

    @property
    def cleared(self) -> bool:
        return self.status.startswith("cleared")


@dataclass(frozen=True)
class BlockedEntry:
    login: str
    reason: str = ""


# --- FLAGGED.md --------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def render_flagged(entries: Iterable[FlagEntry]) -> str:
    """FLAGGED.md with one table row per entry, oldest first."""
    rows = sorted(entries, key=lambda e: (e.date, e.pr, e.label))
    body = "".join(
        f"| {_cell(e.date)} | #{e.pr} | {_cell(e.author)} | {_cell(e.label)} | {_cell(e.reason)} | {_cell(e.status)} |\n"
        for e in rows
    )
    return _FLAGGED_HEADER + body


def parse_flagged(text: str) -> list[FlagEntry]:
    """The entries of a FLAGGED.md (header and prose ignored); LedgerError names a malformed row."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("| ") or line.startswith("| date ") or set(line) <= set("|- "):
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) != 6 or not re.fullmatch(r"#\d+", cells[1]):
            raise LedgerError(
                f"{FLAGGED_PATH}:{number}: expected | date | #PR | author | label | reason | status |"
            )
        out.append(FlagEntry(cells[0], int(cells[1][1:]), cells[2], cells[3], cells[4], cells[5] or "open"))
    return out


def flag(entries: list[FlagEntry], new: FlagEntry) -> list[FlagEntry]:
    """The entries with `new` added, unless the same PR already has an open row for that label."""
    if any(e.pr == new.pr and e.label == new.label and not e.cleared for e in entries):
        return entries
    return [*entries, new]


def clear(entries: list[FlagEntry], pr: int, by: str, reason: str) -> tuple[list[FlagEntry], int]:
    """Mark every open row of a PR cleared; returns the entries and how many rows changed."""
    out, changed = [], 0
    for e in entries:
        if e.pr == pr and not e.cleared:
            e = FlagEntry(e.date, e.pr, e.author, e.label, e.reason, f"cleared by {by}: {reason}")
            changed += 1
        out.append(e)
    return out, changed


# --- blocked-contributors.txt ------------------------------------------------------------------------


def render_blocked(entries: Iterable[BlockedEntry]) -> str:
    """blocked-contributors.txt, one login per line, sorted case-insensitively."""
    lines = [f"{e.login}  # {_cell(e.reason)}" if e.reason else e.login for e in _unique_logins(entries)]
    return _BLOCKED_HEADER + "".join(f"{line}\n" for line in sorted(lines, key=str.lower))


def parse_blocked(text: str, report: Callable[[str], None] | None = None) -> list[BlockedEntry]:
    """The logins of a blocked-contributors.txt. A line that is not a GitHub login is skipped and
    reported (file:line and why), never fatal: one bad hand edit must not stop every poll."""
    out = []
    for number, raw in enumerate(text.splitlines(), 1):
        login, _, reason = raw.partition("#")
        login = login.strip()
        if not login:
            continue
        if not is_login(login):
            if report is not None:
                report(f"{BLOCKED_PATH}:{number}: {login[:60]!r} is not a GitHub login; line skipped")
            continue
        out.append(BlockedEntry(login, reason.strip()))
    return _unique_logins(out)


@dataclass(frozen=True)
class BlockedSync:
    """What one reading of blocked-contributors.txt means for the store, and what to write back."""

    block: tuple[BlockedEntry, ...]  # lines a maintainer added by hand: blocks for the store
    lift: tuple[str, ...]  # logins a maintainer removed by hand: unblocks for the store
    blocked: tuple[BlockedEntry, ...]  # the store's blocklist once those are applied: the file to write


def reconcile_blocked(listed: Iterable[BlockedEntry], exported: Iterable[str] | None,
                      stored: Iterable[BlockedEntry], known: Iterable[str] = ()) -> BlockedSync:  # fmt: skip
    """The store is the blocklist's one source and the file its export; a hand edit of the file is read
    back as a block or an unblock. `exported` holds the logins the bot last wrote (None before its first
    export), so a line that is missing because the bot never wrote it is exported, and one a maintainer
    removed is lifted. `known`: every login the store ever blocked or unblocked. Logins compare
    case-insensitively."""
    listed = _unique_logins(listed)
    stored = _unique_logins(stored)
    in_file = {e.login.lower() for e in listed}
    in_store = {e.login.lower() for e in stored}
    # before the first export, a line the store knows of is its (an unblock there wins); any other line
    # is a maintainer's addition
    last = in_file & {x.lower() for x in known} if exported is None else {x.lower() for x in exported}
    block = tuple(e for e in listed if e.login.lower() not in last and e.login.lower() not in in_store)
    lift = tuple(e.login for e in stored if e.login.lower() in last and e.login.lower() not in in_file)
    lifted = {x.lower() for x in lift}
    blocked = tuple(e for e in [*stored, *block] if e.login.lower() not in lifted)
    return BlockedSync(block, lift, tuple(sorted(blocked, key=lambda e: e.login.lower())))


def _unique_logins(entries: Iterable[BlockedEntry]) -> list[BlockedEntry]:
    seen: dict[str, BlockedEntry] = {}
    for e in entries:
        seen.setdefault(e.login.lower(), e)
    return list(seen.values())


# --- git I/O -----------------------------------------------------------------------------------------


def _git(repo: Path, *args: str, env: Mapping[str, str] | None = None) -> str:
    try:
        return git.out(repo, *args, env=env, timeout=300)
    except git.GitError as exc:
        raise LedgerError(str(exc)) from exc


def _git_run(repo: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    try:
        return git.run(repo, *args, timeout=timeout)
    except git.GitError as exc:
        raise LedgerError(str(exc)) from exc


def read_ledgers(remote: str, branch: str = LEDGER_BRANCH) -> dict[str, str]:
    """The ledger files as they are on the remote's ledger branch (empty texts when it does not exist yet)."""
    with tempfile.TemporaryDirectory(prefix="evalbot-ledger-") as tmp:
        repo = Path(tmp)
        _git(repo, "init", "-q")
        fetched = _git_run(repo, "fetch", "-q", "--depth=1", remote, branch)
        if fetched.returncode != 0:
            if "couldn't find remote ref" in fetched.stderr:
                return {FLAGGED_PATH: "", BLOCKED_PATH: ""}
            raise LedgerError(f"cannot read the ledgers from {remote}: {fetched.stderr.strip()[-500:]}")
        out = {}
        for path in (FLAGGED_PATH, BLOCKED_PATH):
            shown = _git_run(repo, "show", f"FETCH_HEAD:{path}", timeout=60)
            out[path] = shown.stdout if shown.returncode == 0 else ""
        return out


def commit_ledgers(
    remote: str,
    files: Mapping[str, str],
    message: str,
    *,
    branch: str = LEDGER_BRANCH,
    author: tuple[str, str] = ("evalbot", "evalbot@users.noreply.github.com"),
    attempts: int = 3,
) -> str | None:
    """Commit the files onto the remote's ledger branch and push; the new commit sha, None if nothing changed.

    A push that loses a race (someone else pushed the branch) is retried on top of their commit.
    """
    env = {"GIT_AUTHOR_NAME": author[0], "GIT_AUTHOR_EMAIL": author[1],
           "GIT_COMMITTER_NAME": author[0], "GIT_COMMITTER_EMAIL": author[1]}  # fmt: skip
    last = ""
    for _ in range(attempts):
        with tempfile.TemporaryDirectory(prefix="evalbot-ledger-") as tmp:
            repo = Path(tmp)
            _git(repo, "init", "-q", "-b", branch)
            fetched = _git_run(repo, "fetch", "-q", remote, branch)
            if fetched.returncode == 0:
                _git(repo, "reset", "-q", "--hard", "FETCH_HEAD")
            for path, text in files.items():
                target = repo / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
                _git(repo, "add", path)
            if not _git(repo, "status", "--porcelain"):
                return None
            _git(repo, "commit", "-q", "-m", message, env=env)
            pushed = _git_run(repo, "push", "-q", remote, f"HEAD:refs/heads/{branch}")
            if pushed.returncode == 0:
                return _git(repo, "rev-parse", "HEAD").strip()
            last = pushed.stderr.strip()[-500:]
    raise LedgerError(f"cannot push the ledgers to {remote} after {attempts} attempts: {last}")
