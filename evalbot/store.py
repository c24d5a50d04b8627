"""The bot's state in one SQLite file (WAL): evaluations, actions done, strikes, penalties, the blocklist,
rounds, the ledger, holds, clears, the poll cursor, runner calibrations and a schema version.

Durability. Every write is one ``BEGIN IMMEDIATE`` transaction, so a crash leaves each change whole or
absent. ``synchronous=FULL``: in WAL mode NORMAL may lose the last commits on power loss; a lost
"action done" row would make the bot post a comment or a strike twice. Writes are a few per poll, so
the extra fsync per commit costs nothing that matters. WAL lets ``evalbot status`` and other readers
read while the bot writes.

Evaluations are keyed by (pr, head_sha, base_sha, rules_hash) and move queued -> claimed -> done. A
claim carries a lease: a run that crashed with a claim in hand leaves it to expire, after which
``claim_next`` hands it out again (and ``requeue_claims`` does so at once on a restart), so a crash
retries an evaluation instead of losing it. After ``max_attempts`` claims an evaluation is ``gave_up``,
kept with its last error for a maintainer, so a PR that kills the box cannot loop forever.

Actions (comment, labels, merge, close, strike, ...) use two phases so that a restart never repeats one:

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

Opening never overwrites: a file that is not SQLite, fails SQLite's integrity check, is some other
program's database, or has a newer schema than this code knows is refused with ``StoreError``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from evalbot.model import Measurements, Status, Verdict, from_dict, to_dict
from evalbot.rules import is_login

SCHEMA_VERSION = 3
BUSY_TIMEOUT_MS = 10_000
DEFAULT_LEASE_S = 3 * 3600  # longer than any profile's time budget plus builds
DEFAULT_MAX_ATTEMPTS = 3

_HEADER = b"SQLite format 3\x00"
_KIND = re.compile(r"[a-z][a-z0-9_-]*")
_EVAL_STATES = ("queued", "claimed", "done", "gave_up")

# Each version's statements, applied in order inside one transaction per version. Never edit a
# released version: add the next one.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT""",
        """CREATE TABLE evaluations (
            pr INTEGER NOT NULL, head_sha TEXT NOT NULL, base_sha TEXT NOT NULL, rules_hash TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('queued', 'claimed', 'done', 'gave_up')),
            attempts INTEGER NOT NULL DEFAULT 0,
            claimed_by TEXT, lease_until TEXT,
            queued_at TEXT NOT NULL, started_at TEXT, finished_at TEXT,
            status TEXT, verdict TEXT, measurements TEXT, receipt TEXT, error TEXT,
            PRIMARY KEY (pr, head_sha, base_sha, rules_hash)
        ) STRICT""",
        """CREATE INDEX evaluations_by_state ON evaluations (state, queued_at)""",
        """CREATE TABLE actions (
            key TEXT PRIMARY KEY, kind TEXT NOT NULL, pr INTEGER,
            state TEXT NOT NULL CHECK (state IN ('intent', 'done', 'cancelled')),
            payload TEXT NOT NULL, result TEXT, note TEXT, attempts INTEGER NOT NULL,
            begun_at TEXT NOT NULL, finished_at TEXT
        ) STRICT""",
        """CREATE INDEX actions_by_state ON actions (state, begun_at)""",
        """CREATE TABLE strikes (
            id INTEGER PRIMARY KEY, author TEXT NOT NULL COLLATE NOCASE, pr INTEGER NOT NULL,
            reason TEXT NOT NULL, at TEXT NOT NULL, UNIQUE (author, pr, reason)
        ) STRICT""",
        """CREATE TABLE penalties (
            author TEXT PRIMARY KEY COLLATE NOCASE, frozen_until TEXT NOT NULL, reason TEXT NOT NULL,
            set_at TEXT NOT NULL
        ) STRICT""",
        """CREATE TABLE blocklist_events (
            id INTEGER PRIMARY KEY, login TEXT NOT NULL COLLATE NOCASE,
            event TEXT NOT NULL CHECK (event IN ('block', 'unblock')),
            reason TEXT NOT NULL, by TEXT NOT NULL, at TEXT NOT NULL
        ) STRICT""",
        """CREATE TABLE rounds (
            id TEXT PRIMARY KEY, base_sha TEXT NOT NULL, opened_at TEXT NOT NULL, closed_at TEXT,
            winner INTEGER
        ) STRICT""",
        """CREATE TABLE round_members (
            round_id TEXT NOT NULL REFERENCES rounds (id), pr INTEGER NOT NULL, head_sha TEXT NOT NULL,
            lower_bound_gain REAL, PRIMARY KEY (round_id, pr)
        ) STRICT""",
        """CREATE TABLE ledger (
            id INTEGER PRIMARY KEY, kind TEXT NOT NULL CHECK (kind IN ('merge', 'credit')),
            pr INTEGER NOT NULL, sha TEXT NOT NULL, author TEXT NOT NULL, gain REAL,
            marginal_gain REAL, at TEXT NOT NULL, UNIQUE (kind, pr, sha)
        ) STRICT""",
        """CREATE TABLE holds (
            id INTEGER PRIMARY KEY, pr INTEGER NOT NULL, by TEXT NOT NULL, reason TEXT NOT NULL,
            at TEXT NOT NULL, released_by TEXT, released_at TEXT
        ) STRICT""",
        """CREATE UNIQUE INDEX one_active_hold ON holds (pr) WHERE released_at IS NULL""",
        """CREATE TABLE clears (
            id INTEGER PRIMARY KEY, pr INTEGER NOT NULL, by TEXT NOT NULL, reason TEXT NOT NULL,
            at TEXT NOT NULL
        ) STRICT""",
        """CREATE TABLE poll_state (
            name TEXT PRIMARY KEY, etag TEXT, cursor TEXT, updated_at TEXT NOT NULL
        ) STRICT""",
    ),
    # `evalbot calibrate`: main against main on one box, one row per (model, context) per calibration.
    2: (
        """CREATE TABLE calibrations (
            id INTEGER PRIMARY KEY, at TEXT NOT NULL, box TEXT NOT NULL, profile TEXT NOT NULL,
            model TEXT NOT NULL, context INTEGER NOT NULL, runs INTEGER NOT NULL CHECK (runs >= 1),
            false_positive_rate REAL NOT NULL CHECK (false_positive_rate BETWEEN 0 AND 1),
            mde REAL NOT NULL, noise_cv REAL NOT NULL, details TEXT NOT NULL,
            UNIQUE (at, box, profile, model, context)
        ) STRICT""",
        """CREATE INDEX calibrations_by_profile ON calibrations (profile, at)""",
    ),
    # a clear exempts one head: a later push is screened again (NULL: a clear recorded before heads were)
    3: ("""ALTER TABLE clears ADD COLUMN head_sha TEXT""",),
}
_TABLES = frozenset(
    "meta evaluations actions strikes penalties blocklist_events rounds round_members ledger holds clears "
    "poll_state calibrations".split()
)


class StoreError(Exception):
    """The store cannot be opened or the requested change is not allowed; the message says why."""


class CorruptStoreError(StoreError):
    """The file is not a SQLite database, or SQLite finds it damaged; it is left untouched."""


class SchemaError(StoreError):
    """The store's schema is newer than this code, or is not an evalbot store at all."""


class StoreBusyError(StoreError):
    """Another process kept the write lock for longer than the busy timeout; nothing was written."""


class ActionPendingError(StoreError):
    """An action's intent was recorded but not its outcome: reconcile it with GitHub first."""


# ---------------------------------------------------------------- records


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


@dataclass(frozen=True)
class Strike:
    author: str
    pr: int
    reason: str
    at: str


@dataclass(frozen=True)
class Penalty:
    author: str
    frozen_until: str
    reason: str
    set_at: str


@dataclass(frozen=True)
class BlockEvent:
    login: str
    event: str  # block or unblock
    reason: str
    by: str
    at: str


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


@dataclass(frozen=True)
class PollState:
    name: str
    etag: str | None
    cursor: str | None
    updated_at: str


@dataclass(frozen=True)
class Calibration:
    """One box's A/A calibration at one (model, context): how often main against main got a tier or a
    regression call, the effect it can resolve, and its pair-to-pair noise (see evalbot.calibrate)."""

    at: str  # ISO 8601 UTC, as iso() writes it
    box: str  # the runner's name (or host name)
    profile: str
    model: str
    context: int
    runs: int  # A/A evaluations that measured this context
    false_positive_rate: float  # fraction of those runs with a tier awarded or a regression called here
    mde: float  # median minimum detectable effect over the runs (0.01 = 1%)
    noise_cv: float  # pooled within-run SD of the per-pair ln(head/base): the ratio's CV
    details: dict[str, Any]


# ---------------------------------------------------------------- helpers


def iso(moment: datetime | None = None) -> str:
    """A timezone-aware moment (default: now) as fixed-width ISO 8601 UTC: 2026-11-30T10:00:00.000000Z."""
    if moment is None:
        moment = datetime.now(UTC)
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"expected a timezone-aware datetime, got naive {moment.isoformat()}")
    # Fixed width, so text order is time order in SQL comparisons.
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def action_key(kind: str, pr: int | None, head_sha: str, intent: Any) -> str:
    """``kind:pr:head_sha:digest`` where digest covers the canonical JSON of the intent."""
    _check_kind(kind)
    digest = hashlib.sha256(_dumps(intent, "intent").encode("utf-8")).hexdigest()[:16]
    return f"{kind}:{'-' if pr is None else pr}:{head_sha}:{digest}"


def _dumps(value: Any, what: str) -> str:
    try:
        return json.dumps(to_dict(value), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not JSON data: {exc}") from None


def _loads(text: str | None, where: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CorruptStoreError(f"{where}: stored JSON is unreadable ({exc})") from None


def _check_kind(kind: str) -> None:
    if not isinstance(kind, str) or not _KIND.fullmatch(kind):
        raise ValueError(f"action kind: expected lowercase letters, digits, '_' or '-', got {kind!r}")


def _check_pr(pr: Any) -> int:
    if isinstance(pr, bool) or not isinstance(pr, int) or pr < 1:
        raise ValueError(f"pr: expected a positive integer, got {pr!r}")
    return pr


def _check_text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what}: expected non-empty text, got {value!r}")
    return value


def _check_gain(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what}: expected a finite number or None, got {value!r}")
    return float(value)


def _check_key(key: EvalKey) -> EvalKey:
    if not isinstance(key, EvalKey):
        raise TypeError(f"expected an EvalKey, got {type(key).__name__}")
    _check_pr(key.pr)
    for name in ("head_sha", "base_sha", "rules_hash"):
        _check_text(getattr(key, name), name)
    return key


# ---------------------------------------------------------------- the store


class Store:
    """The bot's SQLite state. Open with ``Store(path)``; use as a context manager or call ``close()``."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        self.path = Path(path)
        self._busy_timeout_ms = int(busy_timeout_ms)
        _check_file(self.path)
        try:
            self._conn = sqlite3.connect(
                self.path, timeout=busy_timeout_ms / 1000, isolation_level=None, check_same_thread=True
            )
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open the store: {exc}") from None
        try:
            self._setup(busy_timeout_ms)
        except BaseException:
            self._conn.close()
            raise

    def _setup(self, busy_timeout_ms: int) -> None:
        conn = self._conn
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        try:
            rows = conn.execute("PRAGMA quick_check").fetchall()
        except sqlite3.DatabaseError as exc:
            raise CorruptStoreError(
                f"{self.path}: not a usable SQLite database ({exc}); left untouched"
            ) from None
        problems = [r[0] for r in rows if r[0] != "ok"]
        if problems:
            shown = "; ".join(problems[:3])
            raise CorruptStoreError(f"{self.path}: SQLite integrity check failed ({shown}); left untouched")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables and "meta" not in tables:
            raise SchemaError(
                f"{self.path}: not an evalbot store (it holds tables {', '.join(sorted(tables))} and no "
                "meta table); refusing to change it"
            )
        self._check_version(conn)  # before WAL mode rewrites the header of a store we must not touch
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise StoreError(
                f"{self.path}: SQLite refused WAL mode (journal_mode is {mode!r}); the store needs a local "
                "file system"
            )
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        self._migrate()

    def _migrate(self) -> None:
        # Only an older store takes the write lock: opening an up-to-date one (a reader) never waits on
        # the bot's writes.
        if self._check_version(self._conn) == SCHEMA_VERSION:
            return
        with self._write() as conn:
            version = self._check_version(conn)  # again, under the lock: another process may have migrated
            for v in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[v]:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (str(v),),
                )

    def _check_version(self, conn: sqlite3.Connection) -> int:
        version = self._version(conn)
        if version > SCHEMA_VERSION:
            raise SchemaError(
                f"{self.path}: store schema version {version} is newer than this evalbot's "
                f"({SCHEMA_VERSION}); upgrade evalbot. The store was not changed."
            )
        return version

    def _version(self, conn: sqlite3.Connection) -> int:
        has_meta = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
        ).fetchone()
        if not has_meta:
            return 0
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None or not str(row[0]).isdigit():
            raise SchemaError(
                f"{self.path}: the meta table has no valid schema_version (got "
                f"{None if row is None else row[0]!r}); refusing to change the store"
            )
        return int(row[0])

    @property
    def schema_version(self) -> int:
        """The schema version recorded in the store."""
        return self._version(self._conn)

    def open_connection(self) -> sqlite3.Connection:
        """A second connection to the store's file, with its pragmas and Python's implicit transactions,
        for modules that keep their own tables in it (copycat_index): ``with conn:`` commits or rolls back."""
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout_ms / 1000)
        conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    def close(self) -> None:
        """Close the connection; the WAL is checkpointed by SQLite when the last connection closes."""
        self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        # IMMEDIATE takes the write lock up front: a deferred transaction that later needs it could fail
        # with SQLITE_BUSY halfway, after reads that the busy timeout cannot retry.
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise StoreBusyError(
                f"{self.path}: another process held the store's write lock past the busy timeout ({exc})"
            ) from None
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        cur = self._conn.execute(sql, params)
        cur.row_factory = sqlite3.Row
        return cur.fetchall()

    # ---------------------------------------------------------------- meta

    def meta(self, key: str) -> str | None:
        """A value from the key-value meta table, or None."""
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_meta(self, key: str, value: str) -> None:
        """Set a meta value; the schema version is the migrations' alone."""
        _check_text(key, "meta key")
        if key == "schema_version":
            raise ValueError("meta key 'schema_version' is managed by the store's migrations")
        if not isinstance(value, str):
            raise ValueError(f"meta value: expected text, got {value!r}")
        with self._write() as conn:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    # ---------------------------------------------------------------- evaluations

    def enqueue_evaluation(self, key: EvalKey, now: datetime | None = None) -> bool:
        """Queue an evaluation; False if this key is already known in any state."""
        _check_key(key)
        with self._write() as conn:
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
        moment = now or datetime.now(UTC)
        stamp, lease = iso(moment), iso(moment + timedelta(seconds=lease_s))
        with self._write() as conn:
            while True:
                row = conn.execute(
                    "SELECT pr, head_sha, base_sha, rules_hash, attempts FROM evaluations "
                    "WHERE state = 'queued' OR (state = 'claimed' AND lease_until < ?) "
                    "ORDER BY queued_at, pr LIMIT 1",
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
        with self._write() as conn:
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

    def requeue_evaluation(self, key: EvalKey, now: datetime | None = None, *, keep_attempts: bool = False) -> bool:
        """Queue a known evaluation again; False if it is claimed right now.

        Its last verdict stays readable until the new run replaces it. A maintainer's rerun starts the
        attempt count over; the bot's own retry (an INCONCLUSIVE run) keeps it, so retries stay bounded.
        """
        _check_key(key)
        with self._write() as conn:
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
        with self._write() as conn:
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
        rows = self._read(
            "SELECT * FROM evaluations WHERE pr = ? AND head_sha = ? AND base_sha = ? AND rules_hash = ?",
            (key.pr, key.head_sha, key.base_sha, key.rules_hash),
        )
        return _evaluation_record(rows[0]) if rows else None

    def evaluations(self, pr: int | None = None, state: str | None = None) -> list[EvaluationRecord]:
        """Evaluations, oldest first, optionally of one PR and/or in one state."""
        if state is not None and state not in _EVAL_STATES:
            raise ValueError(f"state: expected one of {', '.join(_EVAL_STATES)}, got {state!r}")
        rows = self._read(
            "SELECT * FROM evaluations WHERE (? IS NULL OR pr = ?) AND (? IS NULL OR state = ?) "
            "ORDER BY queued_at, pr, head_sha",
            (pr, pr, state, state),
        )
        return [_evaluation_record(r) for r in rows]

    # ---------------------------------------------------------------- actions

    def begin_action(self, key: str, payload: Any, now: datetime | None = None, *, redo: bool = False) -> bool:
        """Record the intent to act; False if the action is already done, unless `redo`: a caller that
        planned from GitHub's live state (a label a human removed, a comment deleted) acts again.

        ActionPendingError if an earlier intent has no recorded outcome: reconcile it first.
        """
        kind, pr = _parse_action_key(key)
        blob = _dumps(payload, "action payload")
        with self._write() as conn:
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
        with self._write() as conn:
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
        with self._write() as conn:
            row = conn.execute("SELECT state FROM actions WHERE key = ?", (key,)).fetchone()
            if row is None or row[0] != "intent":
                state = "unknown" if row is None else row[0]
                raise StoreError(f"action {key} is {state}, not a pending intent; nothing to cancel")
            conn.execute(
                "UPDATE actions SET state = 'cancelled', note = ?, finished_at = ? WHERE key = ?",
                (note, iso(now), key),
            )

    def action_done(self, key: str) -> bool:
        """Whether the action's completion is recorded."""
        row = self._conn.execute("SELECT state FROM actions WHERE key = ?", (key,)).fetchone()
        return row is not None and row[0] == "done"

    def action(self, key: str) -> ActionRecord | None:
        """One action's record, or None."""
        rows = self._read("SELECT * FROM actions WHERE key = ?", (key,))
        return _action_record(rows[0]) if rows else None

    def pending_actions(self, kind: str | None = None, pr: int | None = None) -> list[ActionRecord]:
        """Intents without a recorded outcome, oldest first: each needs reconciling with GitHub."""
        rows = self._read(
            "SELECT * FROM actions WHERE state = 'intent' "
            "AND (? IS NULL OR kind = ?) AND (? IS NULL OR pr = ?) "
            "ORDER BY begun_at, key",
            (kind, kind, pr, pr),
        )
        return [_action_record(r) for r in rows]

    # ---------------------------------------------------------------- strikes and penalties

    def add_strike(self, author: str, pr: int, reason: str, now: datetime | None = None) -> bool:
        """Record a strike; False if this author already has one for this PR and reason."""
        _check_text(author, "author")
        _check_pr(pr)
        _check_text(reason, "reason")
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO strikes (author, pr, reason, at) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (author, pr, reason, iso(now)),
            )
            return cur.rowcount == 1

    def strikes(self, author: str | None = None, since: datetime | None = None) -> list[Strike]:
        """Strikes, oldest first, optionally of one author (any case) and from a moment on."""
        rows = self._read(
            "SELECT author, pr, reason, at FROM strikes "
            "WHERE (? IS NULL OR author = ?) AND at >= ? ORDER BY at, id",
            (author, author, "" if since is None else iso(since)),
        )
        return [Strike(**dict(r)) for r in rows]

    def set_penalty(
        self, author: str, frozen_until: datetime, reason: str, now: datetime | None = None
    ) -> Penalty:
        """Freeze an author until a moment; a shorter penalty never shortens a longer one in force."""
        _check_text(author, "author")
        _check_text(reason, "reason")
        until = iso(frozen_until)
        with self._write() as conn:
            row = conn.execute("SELECT frozen_until FROM penalties WHERE author = ?", (author,)).fetchone()
            if row is None or row[0] < until:
                conn.execute(
                    "INSERT INTO penalties (author, frozen_until, reason, set_at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (author) DO UPDATE SET frozen_until = excluded.frozen_until, "
                    "reason = excluded.reason, set_at = excluded.set_at",
                    (author, until, reason, iso(now)),
                )
        penalty = self.penalty(author)
        assert penalty is not None
        return penalty

    def lift_penalty(self, author: str) -> bool:
        """Remove an author's penalty; False if there was none."""
        with self._write() as conn:
            return conn.execute("DELETE FROM penalties WHERE author = ?", (author,)).rowcount == 1

    def penalty(self, author: str) -> Penalty | None:
        """An author's penalty (expired or not), or None."""
        rows = self._read(
            "SELECT author, frozen_until, reason, set_at FROM penalties WHERE author = ?", (author,)
        )
        return Penalty(**dict(rows[0])) if rows else None

    def frozen_authors(self, now: datetime | None = None) -> frozenset[str]:
        """Authors whose penalty is still in force."""
        rows = self._conn.execute(
            "SELECT author FROM penalties WHERE frozen_until > ?", (iso(now),)
        ).fetchall()
        return frozenset(r[0] for r in rows)

    # ---------------------------------------------------------------- blocklist

    def block(self, login: str, reason: str, by: str, now: datetime | None = None) -> bool:
        """Block a login; False if it is already blocked. Every block and unblock is kept."""
        return self._block_event(login, "block", reason, by, now)

    def unblock(self, login: str, reason: str, by: str, now: datetime | None = None) -> bool:
        """Unblock a login; False if it was not blocked."""
        return self._block_event(login, "unblock", reason, by, now)

    def _block_event(self, login: str, event: str, reason: str, by: str, now: datetime | None) -> bool:
        if not is_login(login):
            raise ValueError(f"login: expected a GitHub login (letters, digits, hyphens; at most 39), got {login[:60]!r}")
        _check_text(reason, "reason")
        _check_text(by, "by")
        with self._write() as conn:
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
        rows = self._read(
            "SELECT login, event, reason, by, at FROM blocklist_events e WHERE id = "
            "(SELECT max(id) FROM blocklist_events WHERE login = e.login) AND event = 'block' ORDER BY login"
        )
        return [BlockEvent(**dict(r)) for r in rows]

    def blocklist_history(self, login: str | None = None) -> list[BlockEvent]:
        """Every block and unblock, oldest first."""
        rows = self._read(
            "SELECT login, event, reason, by, at FROM blocklist_events "
            "WHERE (? IS NULL OR login = ?) ORDER BY id",
            (login, login),
        )
        return [BlockEvent(**dict(r)) for r in rows]

    # ---------------------------------------------------------------- rounds

    def open_round(self, round_id: str, base_sha: str, now: datetime | None = None) -> bool:
        """Open a round against a main sha; False if a round of this id exists."""
        _check_text(round_id, "round id")
        _check_text(base_sha, "base_sha")
        with self._write() as conn:
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
        with self._write() as conn:
            self._open_round_row(conn, round_id)
            conn.execute(
                "INSERT INTO round_members (round_id, pr, head_sha, lower_bound_gain) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (round_id, pr) DO UPDATE SET head_sha = excluded.head_sha, "
                "lower_bound_gain = excluded.lower_bound_gain",
                (round_id, pr, head_sha, gain),
            )

    def close_round(self, round_id: str, winner: int | None, now: datetime | None = None) -> None:
        """Close an open round, naming the PR that merged (None if none did)."""
        with self._write() as conn:
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
        rows = self._read(
            "SELECT id, base_sha, opened_at, closed_at, winner FROM rounds WHERE id = ?", (round_id,)
        )
        if not rows:
            return None
        members = self._read(
            "SELECT pr, head_sha, lower_bound_gain FROM round_members WHERE round_id = ? ORDER BY pr",
            (round_id,),
        )
        return Round(**dict(rows[0]), members=tuple(RoundMember(**dict(m)) for m in members))

    def open_rounds(self) -> list[Round]:
        """Rounds not yet closed, oldest first."""
        ids = self._conn.execute(
            "SELECT id FROM rounds WHERE closed_at IS NULL ORDER BY opened_at, id"
        ).fetchall()
        return [r for (i,) in ids if (r := self.round(i)) is not None]

    # ---------------------------------------------------------------- ledger

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
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO ledger (kind, pr, sha, author, gain, marginal_gain, at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                (kind, pr, sha, author, *values, iso(now)),
            )
            return cur.rowcount == 1

    def ledger(self, author: str | None = None) -> list[LedgerEntry]:
        """Ledger entries, oldest first, optionally of one author."""
        rows = self._read(
            "SELECT kind, pr, sha, author, gain, marginal_gain, at FROM ledger "
            "WHERE (? IS NULL OR author = ? COLLATE NOCASE) ORDER BY id",
            (author, author),
        )
        return [LedgerEntry(**dict(r)) for r in rows]

    # ---------------------------------------------------------------- holds and clears

    def hold(self, pr: int, by: str, reason: str, now: datetime | None = None) -> bool:
        """Put a PR on hold (a maintainer's ``hold PR``); False if it is already held."""
        _check_pr(pr)
        _check_text(by, "by")
        _check_text(reason, "reason")
        with self._write() as conn:
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
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE holds SET released_by = ?, released_at = ? WHERE pr = ? AND released_at IS NULL",
                (by, iso(now), pr),
            )
            return cur.rowcount == 1

    def hold_for(self, pr: int) -> Hold | None:
        """The PR's hold in force, or None."""
        rows = self._read("SELECT * FROM holds WHERE pr = ? AND released_at IS NULL", (pr,))
        return _hold(rows[0]) if rows else None

    def holds(self, active_only: bool = True) -> list[Hold]:
        """Holds (those in force, or all of them), oldest first."""
        rows = self._read(
            "SELECT * FROM holds WHERE NOT ? OR released_at IS NULL ORDER BY id", (active_only,)
        )
        return [_hold(r) for r in rows]

    def add_clear(self, pr: int, by: str, reason: str, now: datetime | None = None, *,
                  head_sha: str | None = None) -> Clear:
        """Record a maintainer's ``clear PR --reason`` of one head; the reason is required."""
        _check_pr(pr)
        _check_text(by, "by")
        _check_text(reason, "reason")
        if head_sha is not None and not re.fullmatch(r"[0-9a-f]{40}", head_sha):
            raise ValueError(f"head_sha: expected a 40-hex commit sha, got {head_sha!r}")
        at = iso(now)
        with self._write() as conn:
            conn.execute("INSERT INTO clears (pr, by, reason, at, head_sha) VALUES (?, ?, ?, ?, ?)",
                         (pr, by, reason, at, head_sha))
        return Clear(pr, by, reason, at, head_sha)

    def clears(self, pr: int | None = None) -> list[Clear]:
        """Clears, oldest first, optionally of one PR."""
        rows = self._read(
            "SELECT pr, by, reason, at, head_sha FROM clears WHERE (? IS NULL OR pr = ?) ORDER BY id", (pr, pr)
        )
        return [Clear(**dict(r)) for r in rows]

    def cleared(self, pr: int, head_sha: str) -> bool:
        """Whether a maintainer cleared this PR at this head (a later push is screened again)."""
        return any(c.head_sha == head_sha for c in self.clears(pr))

    # ---------------------------------------------------------------- polling

    def poll_state(self, name: str) -> PollState | None:
        """The saved ETag and cursor of one polled listing, or None."""
        rows = self._read("SELECT name, etag, cursor, updated_at FROM poll_state WHERE name = ?", (name,))
        return PollState(**dict(rows[0])) if rows else None

    def set_poll_state(
        self, name: str, etag: str | None, cursor: str | None, now: datetime | None = None
    ) -> None:
        """Save a listing's ETag and cursor once its page has been fully handled."""
        _check_text(name, "poll name")
        with self._write() as conn:
            conn.execute(
                "INSERT INTO poll_state (name, etag, cursor, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET etag = excluded.etag, cursor = excluded.cursor, "
                "updated_at = excluded.updated_at",
                (name, etag, cursor, iso(now)),
            )

    # ---------------------------------------------------------------- calibrations

    def record_calibration(self, c: Calibration) -> bool:
        """Store one calibration row; False if this (at, box, profile, model, context) is already stored."""
        if not isinstance(c, Calibration):
            raise TypeError(f"expected a Calibration, got {type(c).__name__}")
        for name in ("at", "box", "profile", "model"):
            _check_text(getattr(c, name), name)
        for name, least in (("context", 0), ("runs", 1)):
            value = getattr(c, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name}: expected an integer >= {least}, got {value!r}")
        numbers = []
        for name, high in (("false_positive_rate", 1.0), ("mde", math.inf), ("noise_cv", math.inf)):
            value = _check_gain(getattr(c, name), name)
            if value is None or not 0.0 <= value <= high:
                raise ValueError(f"{name}: expected a finite number in [0, {high}], got {getattr(c, name)!r}")
            numbers.append(value)
        if not isinstance(c.details, dict):
            raise ValueError(f"details: expected a dict, got {type(c.details).__name__}")
        blob = _dumps(c.details, "calibration details")
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO calibrations (at, box, profile, model, context, runs, false_positive_rate, mde, "
                "noise_cv, details) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (c.at, c.box, c.profile, c.model, c.context, c.runs, *numbers, blob),
            )
            return cur.rowcount == 1

    def calibrations(self, profile: str | None = None) -> list[Calibration]:
        """Calibration rows, oldest first, optionally of one profile."""
        rows = self._read(
            "SELECT at, box, profile, model, context, runs, false_positive_rate, mde, noise_cv, details "
            "FROM calibrations WHERE (? IS NULL OR profile = ?) ORDER BY at, id",
            (profile, profile),
        )
        out = []
        for r in rows:
            fields = dict(r)
            fields["details"] = _loads(r["details"], f"calibration of {r['box']} at {r['at']}")
            out.append(Calibration(**fields))
        return out


# ---------------------------------------------------------------- opening and rows


def _check_file(path: Path) -> None:
    """Refuse, before SQLite touches it, anything that is not a whole SQLite file. A new store is made
    only where no file exists: SQLite would take a zero-byte file (a failed copy, a full disk) for a new
    empty database, and the bot would silently start over without its state."""
    if path.is_dir():
        raise StoreError(f"{path}: is a directory; expected a store file")
    if not path.parent.is_dir():
        raise StoreError(f"{path}: its folder {path.parent} does not exist")
    try:
        with path.open("rb") as fh:
            header = fh.read(100)
            size = fh.seek(0, os.SEEK_END)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(f"{path}: cannot read the store: {exc.strerror}") from None
    if size == 0:
        raise CorruptStoreError(f"{path}: the state file is empty (0 bytes), not a new store; refusing to open "
                                "it (restore it from a backup, or delete it to start a new one)")
    if header[: len(_HEADER)] != _HEADER:
        raise CorruptStoreError(
            f"{path}: not a SQLite database (it starts with {header[:16]!r}); refusing to open or overwrite it"
        )
    page = int.from_bytes(header[16:18], "big") if len(header) >= 18 else 0
    page = 65536 if page == 1 else page
    pages = int.from_bytes(header[28:32], "big") if len(header) >= 100 else 0
    valid = len(header) >= 100 and header[24:28] == header[92:96]  # the in-header size is trustworthy
    if len(header) < 100 or page < 512 or size % page or (valid and size < page * pages):
        raise CorruptStoreError(f"{path}: the state file is truncated ({size} bytes; its header says "
                                f"{pages} pages of {page}); refusing to open it")


def _show_key(key: EvalKey) -> str:
    return f"PR {key.pr} head {key.head_sha[:12]} base {key.base_sha[:12]} rules {key.rules_hash[:12]}"


def _parse_action_key(key: str) -> tuple[str, int | None]:
    parts = key.split(":") if isinstance(key, str) else []
    if len(parts) < 4 or not _KIND.fullmatch(parts[0]) or not (parts[1] == "-" or parts[1].isdigit()):
        raise ValueError(f"action key: expected 'kind:pr:head_sha:digest' (see action_key), got {key!r}")
    return parts[0], None if parts[1] == "-" else int(parts[1])


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


def _hold(row: sqlite3.Row) -> Hold:
    return Hold(row["pr"], row["by"], row["reason"], row["at"], row["released_by"], row["released_at"])
