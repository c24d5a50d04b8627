"""Moderation: copycat strikes, the blocklist (its one source: the BLOCKED ledger file is an export of
it), maintainers' holds and clears. Every block, unblock, hold and clear is kept with who and why.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from datetime import datetime

from evalbot.rules import is_login
from evalbot.store.db import Db, _check_pr, _check_text, iso


@dataclass(frozen=True)
class Strike:
    author: str
    pr: int
    reason: str
    at: str


@dataclass(frozen=True)
class BlockEvent:
    login: str
    event: str  # block or unblock
    reason: str
    by: str
    at: str


@dataclass(frozen=True)
class Hold:
    pr: int
    by: str
    reason: str
    at: str
    released_by: str | None
    released_at: str | None


@dataclass(frozen=True)
class Clear:
    pr: int
    by: str
    reason: str
    at: str
    head_sha: str | None = None  # the head the maintainer looked at; None: recorded before heads were


class Moderation:
    """Strikes, the blocklist, holds and clears."""

    def __init__(self, db: Db) -> None:
        self._db = db

    def add_strike(self, author: str, pr: int, reason: str, now: datetime | None = None) -> bool:
        """Record a strike; False if this author already has one for this PR and reason."""
        _check_text(author, "author")
        _check_pr(pr)
        _check_text(reason, "reason")
        with self._db.write() as conn:
            cur = conn.execute(
                "INSERT INTO strikes (author, pr, reason, at) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (author, pr, reason, iso(now)),
            )
            return cur.rowcount == 1

    def strikes(self, author: str | None = None, since: datetime | None = None) -> list[Strike]:
        """Strikes, oldest first, optionally of one author (any case) and from a moment on."""
        return self._db.records(
            Strike,
            "SELECT author, pr, reason, at FROM strikes "
            "WHERE (? IS NULL OR author = ?) AND (? IS NULL OR julianday(at) >= julianday(?)) ORDER BY julianday(at), id",
            (author, author, *[None if since is None else iso(since)] * 2),
        )

    def block(self, login: str, reason: str, by: str, now: datetime | None = None) -> bool:
        """Block a login; False if it is already blocked. Every block and unblock is kept."""
        return self._block_event(login, "block", reason, by, now)

    def unblock(self, login: str, reason: str, by: str, now: datetime | None = None) -> bool:
        """Unblock a login; False if it was not blocked."""
        return self._block_event(login, "unblock", reason, by, now)

    def _block_event(self, login: str, event: str, reason: str, by: str, now: datetime | None) -> bool:
        if not is_login(login):
            raise ValueError(
                f"login: expected a GitHub login (letters, digits, hyphens; at most 39), got {login[:60]!r}"
            )
        _check_text(reason, "reason")
        _check_text(by, "by")
        with self._db.write() as conn:
            row = conn.execute(
                "SELECT event FROM blocklist_events WHERE login = ? ORDER BY id DESC LIMIT 1", (login,)
            ).fetchone()
            current = row[0] if row else "unblock"
            if current == event:
                return False
            conn.execute(
                "INSERT INTO blocklist_events (login, event, reason, by, at) VALUES (?, ?, ?, ?, ?)",
                (login, event, reason, by, iso(now)),
            )
            return True

    def blocklist(self) -> list[BlockEvent]:
        """The logins blocked now, each with the event that blocked it."""
        return self._db.records(
            BlockEvent,
            "SELECT login, event, reason, by, at FROM blocklist_events e WHERE id = "
            "(SELECT max(id) FROM blocklist_events WHERE login = e.login) AND event = 'block' ORDER BY login",
        )

    def blocklist_history(self, login: str | None = None) -> list[BlockEvent]:
        """Every block and unblock, oldest first."""
        return self._db.records(
            BlockEvent,
            "SELECT login, event, reason, by, at FROM blocklist_events "
            "WHERE (? IS NULL OR login = ?) ORDER BY id",
            (login, login),
        )

    def hold(self, pr: int, by: str, reason: str, now: datetime | None = None) -> bool:
        """Put a PR on hold (a maintainer's ``hold PR``); False if it is already held."""
        _check_pr(pr)
        _check_text(by, "by")
        _check_text(reason, "reason")
        with self._db.write() as conn:
            if conn.execute("SELECT 1 FROM holds WHERE pr = ? AND released_at IS NULL", (pr,)).fetchone():
                return False
            conn.execute(
                "INSERT INTO holds (pr, by, reason, at) VALUES (?, ?, ?, ?)", (pr, by, reason, iso(now))
            )
            return True

    def release_hold(self, pr: int, by: str, now: datetime | None = None) -> bool:
        """Release a PR's hold; False if it was not held."""
        _check_pr(pr)
        _check_text(by, "by")
        with self._db.write() as conn:
            cur = conn.execute(
                "UPDATE holds SET released_by = ?, released_at = ? WHERE pr = ? AND released_at IS NULL",
                (by, iso(now), pr),
            )
            return cur.rowcount == 1

    def hold_for(self, pr: int) -> Hold | None:
        """The PR's hold in force, or None."""
        rows = self._db.read("SELECT * FROM holds WHERE pr = ? AND released_at IS NULL", (pr,))
        return _hold(rows[0]) if rows else None

    def holds(self, active_only: bool = True) -> list[Hold]:
        """Holds (those in force, or all of them), oldest first."""
        rows = self._db.read(
            "SELECT * FROM holds WHERE NOT ? OR released_at IS NULL ORDER BY id", (active_only,)
        )
        return [_hold(r) for r in rows]

    def add_clear(
        self, pr: int, by: str, reason: str, now: datetime | None = None, *, head_sha: str | None = None
    ) -> Clear:
        """Record a maintainer's ``clear PR --reason`` of one head; the reason is required."""
        _check_pr(pr)
        _check_text(by, "by")
        _check_text(reason, "reason")
        if head_sha is not None and not re.fullmatch(r"[0-9a-f]{40}", head_sha):
            raise ValueError(f"head_sha: expected a 40-hex commit sha, got {head_sha!r}")
        at = iso(now)
        with self._db.write() as conn:
            conn.execute(
                "INSERT INTO clears (pr, by, reason, at, head_sha) VALUES (?, ?, ?, ?, ?)",
                (pr, by, reason, at, head_sha),
            )
        return Clear(pr, by, reason, at, head_sha)

    def clears(self, pr: int | None = None) -> list[Clear]:
        """Clears, oldest first, optionally of one PR."""
        return self._db.records(
            Clear,
            "SELECT pr, by, reason, at, head_sha FROM clears WHERE (? IS NULL OR pr = ?) ORDER BY id",
            (pr, pr),
        )

    def cleared(self, pr: int, head_sha: str) -> bool:
        """Whether a maintainer cleared this PR at this head (a later push is screened again)."""
        return any(c.head_sha == head_sha for c in self.clears(pr))


def _hold(row: sqlite3.Row) -> Hold:
    return Hold(row["pr"], row["by"], row["reason"], row["at"], row["released_by"], row["released_at"])
