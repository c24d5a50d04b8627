"""Dispatched evaluations (``dispatch_runs``): one row per attempt, written before its workflow is
dispatched, so a restarted poller finds the runs it was following.

A row is open (``dispatching``, then ``in_flight``) until it is closed ``finished``, ``failed`` or
``retried`` (naming the request that took over); a closed row is never reopened. The handle's meaning
(requests, deadlines, retries) is ``evalbot.dispatch``'s: this part keeps and reads the rows.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from evalbot import times
from evalbot.model.github import RunPlacement
from evalbot.store.db import CorruptStoreError, Db, _check_pr, _check_text, iso

OPEN_STATES = ("dispatching", "in_flight")
CLOSED_STATES = ("finished", "failed", "retried")

# columns that a later save may change on an open row: what following the run learnt
_LEARNT = ("run_id", "runner_name", "html_url", "state", "note", "updated_at")


@dataclass(frozen=True)
class DispatchRow(RunPlacement):
    """One attempt at one evaluation on the runner pool: what was asked, where, until when, what came of it."""

    request_id: str
    pr: int
    head_sha: str
    base_sha: str
    rules_hash: str
    profile: str
    attempt: int
    exclude_runners: tuple[str, ...]
    state: str = "dispatching"  # dispatching, in_flight, finished, failed, retried
    note: str = ""
    retried_as: str | None = None  # the request id of the attempt that replaced this one


class Dispatches:
    """The dispatch handles' part of the store."""

    def __init__(self, db: Db) -> None:
        self._db = db

    def save(self, row: DispatchRow, now: datetime | None = None) -> None:
        """Insert an open attempt, or update what was learnt about it (run id, runner, url, state, note);
        an attempt already closed stays as it is (a late save of a stale handle changes nothing)."""
        if row.state not in OPEN_STATES:
            raise ValueError(
                f"save() keeps open attempts ({', '.join(OPEN_STATES)}); close() ends {row.state!r}"
            )
        _check_text(row.request_id, "request_id")
        _check_pr(row.pr)
        values = _columns(row) | {"updated_at": iso(now)}
        names, marks = ", ".join(values), ", ".join("?" for _ in values)
        learnt = ", ".join(f"{c} = excluded.{c}" for c in _LEARNT)
        with self._db.write() as conn:
            conn.execute(
                f"INSERT INTO dispatch_runs ({names}) VALUES ({marks}) ON CONFLICT (request_id) DO UPDATE "
                f"SET {learnt} WHERE dispatch_runs.state IN ('dispatching', 'in_flight')",
                tuple(values.values()),
            )

    def close(self, row: DispatchRow, now: datetime | None = None) -> None:
        """Mark an attempt finished, failed or retried (as ``row.retried_as``), with its note; the run id
        and runner it had learnt are kept where the row has none."""
        if row.state not in CLOSED_STATES:
            raise ValueError(f"close() state must be one of {', '.join(CLOSED_STATES)}, got {row.state!r}")
        with self._db.write() as conn:
            conn.execute(
                "UPDATE dispatch_runs SET state = ?, note = ?, retried_as = ?, run_id = coalesce(?, run_id), "
                "runner_name = coalesce(?, runner_name), updated_at = ? WHERE request_id = ?",
                (row.state, row.note, row.retried_as, row.run_id, row.runner_name, iso(now), row.request_id),
            )

    def open(self) -> list[DispatchRow]:
        """Attempts not yet finished, failed or retried, oldest dispatch first."""
        return self._select("state IN ('dispatching', 'in_flight')", ())

    def history(self, pr: int, head_sha: str, base_sha: str, rules_hash: str) -> list[DispatchRow]:
        """Every attempt at one evaluation, first attempt first."""
        return self._select(
            "pr = ? AND head_sha = ? AND base_sha = ? AND rules_hash = ?",
            (pr, head_sha, base_sha, rules_hash),
        )

    def get(self, request_id: str) -> DispatchRow | None:
        """One attempt by its request id."""
        found = self._select("request_id = ?", (request_id,))
        return found[0] if found else None

    def _select(self, where: str, args: tuple[Any, ...]) -> list[DispatchRow]:
        rows = self._db.read(
            f"SELECT * FROM dispatch_runs WHERE {where} ORDER BY julianday(dispatched_at), attempt, request_id",
            args,
        )
        return [_row(r) for r in rows]


def _columns(row: DispatchRow) -> dict[str, Any]:
    values = asdict(row)
    del values["retried_as"]  # only close() names the attempt that took over
    values["exclude_runners"] = json.dumps(list(row.exclude_runners))
    values["dispatched_at"] = times.stamp(row.dispatched_at)
    values["deadline"] = times.stamp(row.deadline)
    return values


def _row(r: sqlite3.Row) -> DispatchRow:
    try:
        excluded = json.loads(r["exclude_runners"])
    except json.JSONDecodeError as exc:
        raise CorruptStoreError(
            f"dispatch {r['request_id']}: exclude_runners is unreadable ({exc})"
        ) from None
    return DispatchRow(
        r["request_id"], r["pr"], r["head_sha"], r["base_sha"], r["rules_hash"], r["profile"], r["attempt"],
        tuple(excluded), r["state"], r["note"], r["retried_as"], workflow=r["workflow"], ref=r["ref"],
        dispatched_at=times.parse(r["dispatched_at"]), deadline=times.parse(r["deadline"]), run_id=r["run_id"],
        runner_name=r["runner_name"], html_url=r["html_url"],
    )  # fmt: skip
