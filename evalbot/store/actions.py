"""Actions on GitHub (comment, labels, merge, close, strike, ...) in two phases, so a restart never
repeats one:

1. ``begin_action(key, payload)`` commits the intent *before* the GitHub call; False means the action
   is already done, so skip it.
2. make the GitHub call;
3. ``finish_action(key, result)`` commits its completion.

A crash (or a failed call) between 1 and 3 leaves an intent whose outcome is unknown: GitHub may have
applied it. On restart the caller walks ``pending_actions()`` and checks GitHub for each one (a comment
by its hidden marker, labels by the PR's label set, a merge by the PR's merged state), then calls
``finish_action`` if it happened or ``cancel_action`` if it did not, after which ``begin_action`` starts
it afresh. ``begin_action`` raises ``ActionPendingError`` on an unreconciled intent rather than let it be
redone blindly. Keys come from ``action_key(kind, pr, head_sha, intent)``, which digests the intent, so
a different intent (a new comment text) is a different action and the same one is the same key.
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from evalbot.store.db import (
    _KIND,
    ActionPendingError,
    Db,
    StoreError,
    _check_kind,
    _check_text,
    _dumps,
    _loads,
    iso,
)


@dataclass(frozen=True)
class ActionRecord:
    """One side effect on GitHub: intent (outcome unknown), done, or cancelled after reconciliation."""

    key: str
    kind: str
    pr: int | None
    state: str
    payload: Any
    result: Any
    note: str | None
    attempts: int
    begun_at: str
    finished_at: str | None


def action_key(kind: str, pr: int | None, head_sha: str, intent: Any) -> str:
    """``kind:pr:head_sha:digest`` where digest covers the canonical JSON of the intent."""
    _check_kind(kind)
    digest = hashlib.sha256(_dumps(intent, "intent").encode("utf-8")).hexdigest()[:16]
    return f"{kind}:{'-' if pr is None else pr}:{head_sha}:{digest}"


class Actions:
    """The two-phase actions' part of the store."""

    def __init__(self, db: Db) -> None:
        self._db = db

    def begin_action(
        self, key: str, payload: Any, now: datetime | None = None, *, redo: bool = False
    ) -> bool:
        """Record the intent to act; False if the action is already done, unless `redo`: a caller that
        planned from GitHub's live state (a label a human removed, a comment deleted) acts again.

        ActionPendingError if an earlier intent has no recorded outcome: reconcile it first.
        """
        kind, pr = _parse_action_key(key)
        blob = _dumps(payload, "action payload")
        with self._db.write() as conn:
            row = conn.execute("SELECT state, begun_at FROM actions WHERE key = ?", (key,)).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO actions (key, kind, pr, state, payload, attempts, begun_at) "
                    "VALUES (?, ?, ?, 'intent', ?, 1, ?)",
                    (key, kind, pr, blob, iso(now)),
                )
                return True
            if row[0] == "done" and not redo:
                return False
            if row[0] == "intent":
                raise ActionPendingError(
                    f"action {key} was begun at {row[1]} and its outcome is unknown: check GitHub, then "
                    "call finish_action (it happened) or cancel_action (it did not)"
                )
            conn.execute(
                "UPDATE actions SET state = 'intent', payload = ?, result = NULL, attempts = attempts + 1, "
                "begun_at = ?, finished_at = NULL WHERE key = ?",
                (blob, iso(now), key),
            )
            return True

    def finish_action(self, key: str, result: Any = None, now: datetime | None = None) -> None:
        """Record that the action happened (after the GitHub call, or when reconciliation found it done)."""
        blob = _dumps(result, "action result")
        with self._db.write() as conn:
            row = conn.execute("SELECT state FROM actions WHERE key = ?", (key,)).fetchone()
            if row is None:
                raise StoreError(f"action {key} has no recorded intent; call begin_action before acting")
            if row[0] == "done":
                return  # recording the same completion twice changes nothing
            if row[0] == "cancelled":
                raise StoreError(f"action {key} was cancelled; begin it again before finishing it")
            conn.execute(
                "UPDATE actions SET state = 'done', result = ?, finished_at = ? WHERE key = ?",
                (blob, iso(now), key),
            )

    def cancel_action(self, key: str, note: str, now: datetime | None = None) -> None:
        """Record that a pending intent never reached GitHub, so that begin_action may start it again."""
        _check_text(note, "note")
        with self._db.write() as conn:
            row = conn.execute("SELECT state FROM actions WHERE key = ?", (key,)).fetchone()
            if row is None or row[0] != "intent":
                state = "unknown" if row is None else row[0]
                raise StoreError(f"action {key} is {state}, not a pending intent; nothing to cancel")
            conn.execute(
                "UPDATE actions SET state = 'cancelled', note = ?, finished_at = ? WHERE key = ?",
                (note, iso(now), key),
            )

    def action(self, key: str) -> ActionRecord | None:
        """One action's record, or None."""
        rows = self._db.read("SELECT * FROM actions WHERE key = ?", (key,))
        return _action_record(rows[0]) if rows else None

    def pending_actions(self, kind: str | None = None, pr: int | None = None) -> list[ActionRecord]:
        """Intents without a recorded outcome, oldest first: each needs reconciling with GitHub."""
        rows = self._db.read(
            "SELECT * FROM actions WHERE state = 'intent' "
            "AND (? IS NULL OR kind = ?) AND (? IS NULL OR pr = ?) "
            "ORDER BY julianday(begun_at), key",
            (kind, kind, pr, pr),
        )
        return [_action_record(r) for r in rows]


def _parse_action_key(key: str) -> tuple[str, int | None]:
    parts = key.split(":") if isinstance(key, str) else []
    if len(parts) < 4 or not _KIND.fullmatch(parts[0]) or not (parts[1] == "-" or parts[1].isdigit()):
        raise ValueError(f"action key: expected 'kind:pr:head_sha:digest' (see action_key), got {key!r}")
    return parts[0], None if parts[1] == "-" else int(parts[1])


def _action_record(row: sqlite3.Row) -> ActionRecord:
    where = f"action {row['key']}"
    return ActionRecord(
        key=row["key"],
        kind=row["kind"],
        pr=row["pr"],
        state=row["state"],
        payload=_loads(row["payload"], where),
        result=_loads(row["result"], where),
        note=row["note"],
        attempts=row["attempts"],
        begun_at=row["begun_at"],
        finished_at=row["finished_at"],
    )
