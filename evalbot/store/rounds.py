"""Rounds (the PRs measured against one main; a round closes when its winner merges) and the ledger of
merges and credits.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime

from evalbot.store.db import Db, StoreError, _check_gain, _check_pr, _check_text, iso


@dataclass(frozen=True)
class RoundMember:
    pr: int
    head_sha: str
    lower_bound_gain: float | None


@dataclass(frozen=True)
class Round:
    """PRs measured against one main: the round closes when its winner merges."""

    id: str
    base_sha: str
    opened_at: str
    closed_at: str | None
    winner: int | None
    members: tuple[RoundMember, ...]


@dataclass(frozen=True)
class LedgerEntry:
    kind: str  # merge or credit
    pr: int
    sha: str
    author: str
    gain: float | None
    marginal_gain: float | None
    at: str


@dataclass(frozen=True)
class TrackCredit:
    """A merged PR credited with a track it led in its round."""

    track: str
    pr: int
    sha: str
    author: str
    gain: float | None
    at: str


class Rounds:
    """Rounds and the ledger."""

    def __init__(self, db: Db) -> None:
        self._db = db

    def open_round(self, round_id: str, base_sha: str, now: datetime | None = None) -> bool:
        """Open a round against a main sha; False if a round of this id exists."""
        _check_text(round_id, "round id")
        _check_text(base_sha, "base_sha")
        with self._db.write() as conn:
            cur = conn.execute(
                "INSERT INTO rounds (id, base_sha, opened_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                (round_id, base_sha, iso(now)),
            )
            return cur.rowcount == 1

    def set_round_member(self, round_id: str, pr: int, head_sha: str, lower_bound_gain: float | None) -> None:
        """Add a PR to an open round, or update its head and gain after a re-evaluation."""
        _check_pr(pr)
        _check_text(head_sha, "head_sha")
        gain = _check_gain(lower_bound_gain, "lower_bound_gain")
        with self._db.write() as conn:
            self._open_round_row(conn, round_id)
            conn.execute(
                "INSERT INTO round_members (round_id, pr, head_sha, lower_bound_gain) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (round_id, pr) DO UPDATE SET head_sha = excluded.head_sha, "
                "lower_bound_gain = excluded.lower_bound_gain",
                (round_id, pr, head_sha, gain),
            )

    def close_round(self, round_id: str, winner: int | None, now: datetime | None = None) -> None:
        """Close an open round, naming the PR that merged (None if none did)."""
        with self._db.write() as conn:
            self._open_round_row(conn, round_id)
            if winner is not None:
                _check_pr(winner)
                member = conn.execute(
                    "SELECT 1 FROM round_members WHERE round_id = ? AND pr = ?", (round_id, winner)
                ).fetchone()
                if member is None:
                    raise StoreError(f"round {round_id!r}: PR {winner} is not a member, so it cannot win")
            conn.execute(
                "UPDATE rounds SET closed_at = ?, winner = ? WHERE id = ?", (iso(now), winner, round_id)
            )

    @staticmethod
    def _open_round_row(conn: sqlite3.Connection, round_id: str) -> None:
        row = conn.execute("SELECT closed_at FROM rounds WHERE id = ?", (round_id,)).fetchone()
        if row is None:
            raise StoreError(f"round {round_id!r} does not exist")
        if row[0] is not None:
            raise StoreError(f"round {round_id!r} closed at {row[0]}; it cannot change")

    def round(self, round_id: str) -> Round | None:
        """A round with its members (by PR number), or None."""
        rows = self._db.read(
            "SELECT id, base_sha, opened_at, closed_at, winner FROM rounds WHERE id = ?", (round_id,)
        )
        if not rows:
            return None
        members = self._db.records(
            RoundMember,
            "SELECT pr, head_sha, lower_bound_gain FROM round_members WHERE round_id = ? ORDER BY pr",
            (round_id,),
        )
        return Round(**dict(rows[0]), members=tuple(members))

    def record_ledger(
        self,
        kind: str,
        pr: int,
        sha: str,
        author: str,
        gain: float | None,
        marginal_gain: float | None,
        now: datetime | None = None,
    ) -> bool:
        """Record a merge or a credit; False if this (kind, pr, sha) is already in the ledger."""
        if kind not in ("merge", "credit"):
            raise ValueError(f"ledger kind: expected 'merge' or 'credit', got {kind!r}")
        _check_pr(pr)
        _check_text(sha, "sha")
        _check_text(author, "author")
        values = (_check_gain(gain, "gain"), _check_gain(marginal_gain, "marginal_gain"))
        with self._db.write() as conn:
            cur = conn.execute(
                "INSERT INTO ledger (kind, pr, sha, author, gain, marginal_gain, at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                (kind, pr, sha, author, *values, iso(now)),
            )
            return cur.rowcount == 1

    def record_track_credit(self, track: str, pr: int, sha: str, author: str, gain: float | None,
                            now: datetime | None = None) -> bool:  # fmt: skip
        """Credit a merged PR with one track it led (its gain in that track); False if already recorded."""
        _check_text(track, "track")
        _check_pr(pr)
        _check_text(sha, "sha")
        _check_text(author, "author")
        with self._db.write() as conn:
            cur = conn.execute(
                "INSERT INTO track_credits (track, pr, sha, author, gain, at) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                (track, pr, sha, author, _check_gain(gain, "gain"), iso(now)),
            )
            return cur.rowcount == 1

    def track_credits(self) -> list[TrackCredit]:
        """Every track credit, oldest first."""
        return self._db.records(
            TrackCredit, "SELECT track, pr, sha, author, gain, at FROM track_credits ORDER BY id", ()
        )

    def ledger(self, author: str | None = None) -> list[LedgerEntry]:
        """Ledger entries, oldest first, optionally of one author."""
        return self._db.records(
            LedgerEntry,
            "SELECT kind, pr, sha, author, gain, marginal_gain, at FROM ledger "
            "WHERE (? IS NULL OR author = ? COLLATE NOCASE) ORDER BY id",
            (author, author),
        )
