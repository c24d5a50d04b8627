"""Evaluations: keyed by (pr, head_sha, base_sha, rules_hash), queued -> claimed -> done (or gave_up).

A claim carries a lease: a run that crashed with a claim in hand leaves it to expire, after which
``claim_next`` hands it out again (and ``requeue_claims`` does so at once on a restart), so a crash
retries an evaluation instead of losing it. After ``max_attempts`` claims an evaluation is ``gave_up``,
kept with its last error for a maintainer, so a PR that kills the box cannot loop forever.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from evalbot import times
from evalbot.codec import from_dict
from evalbot.model import Measurements, Status, Verdict
from evalbot.store.db import CorruptStoreError, Db, StoreError, _check_pr, _check_text, _dumps, _loads, iso

DEFAULT_LEASE_S = 3 * 3600  # longer than any profile's time budget plus builds

DEFAULT_MAX_ATTEMPTS = 3

_EVAL_STATES = ("queued", "claimed", "done", "gave_up")


@dataclass(frozen=True)
class EvalKey:
    """What one evaluation measured: a PR's head against a base, under one version of the rules."""

    pr: int
    head_sha: str
    base_sha: str
    rules_hash: str


@dataclass(frozen=True)
class EvaluationRecord:
    """One evaluation's row: its state, its claim and, once done, what it produced."""

    key: EvalKey
    state: str  # queued, claimed, done, gave_up
    attempts: int
    claimed_by: str | None
    lease_until: str | None
    queued_at: str
    started_at: str | None
    finished_at: str | None
    status: Status | None
    verdict: Verdict | None
    measurements: Measurements | None
    receipt: dict[str, Any] | None
    error: str | None


class Queue:
    """The evaluation queue's part of the store."""

    def __init__(self, db: Db) -> None:
        self._db = db

    def enqueue_evaluation(self, key: EvalKey, now: datetime | None = None) -> bool:
        """Queue an evaluation; False if this key is already known in any state."""
        _check_key(key)
        with self._db.write() as conn:
            cur = conn.execute(
                "INSERT INTO evaluations (pr, head_sha, base_sha, rules_hash, state, queued_at) "
                "VALUES (?, ?, ?, ?, 'queued', ?) ON CONFLICT DO NOTHING",
                (key.pr, key.head_sha, key.base_sha, key.rules_hash, iso(now)),
            )
            return cur.rowcount == 1

    def claim_next(
        self,
        worker: str,
        now: datetime | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> EvaluationRecord | None:
        """Claim the oldest queued evaluation, or one whose claim's lease ran out; None when there is none.

        An abandoned claim that has used up max_attempts becomes ``gave_up`` instead of running again.
        """
        _check_text(worker, "worker")
        moment = now or times.now()
        stamp, lease = iso(moment), iso(moment + timedelta(seconds=lease_s))
        with self._db.write() as conn:
            while True:
                row = conn.execute(
                    "SELECT pr, head_sha, base_sha, rules_hash, attempts FROM evaluations "
                    "WHERE state = 'queued' OR (state = 'claimed' AND julianday(lease_until) < julianday(?)) "
                    "ORDER BY julianday(queued_at), pr LIMIT 1",
                    (stamp,),
                ).fetchone()
                if row is None:
                    return None
                pk = tuple(row[:4])
                if row[4] >= max_attempts:
                    conn.execute(
                        "UPDATE evaluations SET state = 'gave_up', claimed_by = NULL, lease_until = NULL, "
                        "finished_at = ?, error = CASE WHEN error IS NULL THEN ? ELSE error || '; ' || ? END "
                        "WHERE pr = ? AND head_sha = ? AND base_sha = ? AND rules_hash = ?",
                        (stamp, *[f"gave up after {row[4]} attempts that did not finish"] * 2, *pk),
                    )
                    continue
                conn.execute(
                    "UPDATE evaluations SET state = 'claimed', claimed_by = ?, lease_until = ?, "
                    "attempts = attempts + 1, started_at = ? "
                    "WHERE pr = ? AND head_sha = ? AND base_sha = ? AND rules_hash = ?",
                    (worker, lease, stamp, *pk),
                )
                return self._evaluation(EvalKey(*pk))

    def requeue_claims(self, except_worker: str | None = None) -> list[EvalKey]:
        """Put every claimed evaluation not held by except_worker back in the queue (call on restart)."""
        with self._db.write() as conn:
            rows = conn.execute(
                "SELECT pr, head_sha, base_sha, rules_hash FROM evaluations "
                "WHERE state = 'claimed' AND claimed_by IS NOT ?",
                (except_worker,),
            ).fetchall()
            conn.execute(
                "UPDATE evaluations SET state = 'queued', claimed_by = NULL, lease_until = NULL "
                "WHERE state = 'claimed' AND claimed_by IS NOT ?",
                (except_worker,),
            )
        return [EvalKey(*r) for r in rows]

    def requeue_evaluation(
        self, key: EvalKey, now: datetime | None = None, *, keep_attempts: bool = False
    ) -> bool:
        """Queue a known evaluation again; False if it is claimed right now.

        Its last verdict stays readable until the new run replaces it. A maintainer's rerun starts the
        attempt count over; the bot's own retry (an INCONCLUSIVE run) keeps it, so retries stay bounded.
        """
        _check_key(key)
        with self._db.write() as conn:
            cur = conn.execute(
                "UPDATE evaluations SET state = 'queued', claimed_by = NULL, lease_until = NULL, "
                "attempts = CASE WHEN ? THEN attempts ELSE 0 END, "
                "queued_at = ? WHERE pr = ? AND head_sha = ? AND base_sha = ? AND rules_hash = ? "
                "AND state != 'claimed'",
                (keep_attempts, iso(now), key.pr, key.head_sha, key.base_sha, key.rules_hash),
            )
            return cur.rowcount == 1

    def release_evaluation(self, key: EvalKey, worker: str, error: str = "") -> None:
        """Hand a claim back to the queue (a clean shutdown, or an error worth retrying)."""
        self._update_claimed(
            key,
            worker,
            "state = 'queued', claimed_by = NULL, lease_until = NULL, error = ?",
            (error or None,),
        )

    def finish_evaluation(
        self,
        key: EvalKey,
        worker: str,
        verdict: Verdict,
        measurements: Measurements | None = None,
        receipt: Mapping[str, Any] | None = None,
        now: datetime | None = None,
    ) -> None:
        """Record a claimed evaluation's outcome; StoreError if the worker no longer holds the claim."""
        if not isinstance(verdict, Verdict):
            raise TypeError(f"verdict: expected a Verdict, got {type(verdict).__name__}")
        values = (
            iso(now),
            str(verdict.status),
            _dumps(verdict, "verdict"),
            None if measurements is None else _dumps(measurements, "measurements"),
            None if receipt is None else _dumps(dict(receipt), "receipt"),
        )
        self._update_claimed(
            key,
            worker,
            "state = 'done', claimed_by = NULL, lease_until = NULL, finished_at = ?, status = ?, "
            "verdict = ?, measurements = ?, receipt = ?, error = NULL",
            values,
        )

    def _update_claimed(self, key: EvalKey, worker: str, assignments: str, values: tuple[Any, ...]) -> None:
        _check_key(key)
        with self._db.write() as conn:
            row = conn.execute(
                "SELECT state, claimed_by FROM evaluations "
                "WHERE pr = ? AND head_sha = ? AND base_sha = ? AND rules_hash = ?",
                (key.pr, key.head_sha, key.base_sha, key.rules_hash),
            ).fetchone()
            if row is None:
                raise StoreError(f"evaluation {_show_key(key)} is not in the store")
            if row[0] != "claimed" or row[1] != worker:
                holder = f"claimed by {row[1]!r}" if row[0] == "claimed" else row[0]
                raise StoreError(f"evaluation {_show_key(key)} is not claimed by {worker!r} (it is {holder})")
            conn.execute(
                f"UPDATE evaluations SET {assignments} "
                "WHERE pr = ? AND head_sha = ? AND base_sha = ? AND rules_hash = ?",
                (*values, key.pr, key.head_sha, key.base_sha, key.rules_hash),
            )

    def evaluation(self, key: EvalKey) -> EvaluationRecord | None:
        """One evaluation's record, or None."""
        _check_key(key)
        return self._evaluation(key)

    def _evaluation(self, key: EvalKey) -> EvaluationRecord | None:
        rows = self._db.read(
            "SELECT * FROM evaluations WHERE pr = ? AND head_sha = ? AND base_sha = ? AND rules_hash = ?",
            (key.pr, key.head_sha, key.base_sha, key.rules_hash),
        )
        return _evaluation_record(rows[0]) if rows else None

    def evaluations(self, pr: int | None = None, state: str | None = None) -> list[EvaluationRecord]:
        """Evaluations, oldest first, optionally of one PR and/or in one state."""
        if state is not None and state not in _EVAL_STATES:
            raise ValueError(f"state: expected one of {', '.join(_EVAL_STATES)}, got {state!r}")
        rows = self._db.read(
            "SELECT * FROM evaluations WHERE (? IS NULL OR pr = ?) AND (? IS NULL OR state = ?) "
            "ORDER BY julianday(queued_at), pr, head_sha",
            (pr, pr, state, state),
        )
        return [_evaluation_record(r) for r in rows]


def _check_key(key: EvalKey) -> EvalKey:
    if not isinstance(key, EvalKey):
        raise TypeError(f"expected an EvalKey, got {type(key).__name__}")
    _check_pr(key.pr)
    for name in ("head_sha", "base_sha", "rules_hash"):
        _check_text(getattr(key, name), name)
    return key


def _show_key(key: EvalKey) -> str:
    return f"PR {key.pr} head {key.head_sha[:12]} base {key.base_sha[:12]} rules {key.rules_hash[:12]}"


def _evaluation_record(row: sqlite3.Row) -> EvaluationRecord:
    key = EvalKey(row["pr"], row["head_sha"], row["base_sha"], row["rules_hash"])
    where = f"evaluation {_show_key(key)}"
    try:
        verdict = None if row["verdict"] is None else from_dict(Verdict, _loads(row["verdict"], where))
        measurements = (
            None
            if row["measurements"] is None
            else from_dict(Measurements, _loads(row["measurements"], where))
        )
    except (TypeError, ValueError) as exc:
        raise CorruptStoreError(
            f"{where}: stored verdict or measurements do not fit the model: {exc}"
        ) from None
    return EvaluationRecord(
        key=key,
        state=row["state"],
        attempts=row["attempts"],
        claimed_by=row["claimed_by"],
        lease_until=row["lease_until"],
        queued_at=row["queued_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        status=None if row["status"] is None else Status(row["status"]),
        verdict=verdict,
        measurements=measurements,
        receipt=_loads(row["receipt"], where),
        error=row["error"],
    )
