"""The store's file: opening it safely, one migrations list for every table in it, transactions, and the
checks and JSON helpers its parts share.

Opening never overwrites: a file that is not SQLite, fails SQLite's integrity check, is some other
program's database, or has a newer schema than this code knows is refused with ``StoreError``.
"""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Self, TypeVar

from evalbot import times
from evalbot.codec import to_dict

T = TypeVar("T")

SCHEMA_VERSION = 6
BUSY_TIMEOUT_MS = 10_000
MEMORY = ":memory:"  # as a path: a private store in memory, every table made, gone when it closes


_HEADER = b"SQLite format 3\x00"

_KIND = re.compile(r"[a-z][a-z0-9_-]*")


# The copycat index's tables (evalbot.store.copycat), in migration 4. IF NOT EXISTS: before version 4 the
# copycat index made them itself.
COPYCAT_TABLES: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS copycat_prs (
        number INTEGER PRIMARY KEY, author TEXT NOT NULL, created_at TEXT NOT NULL, merged_at TEXT,
        closed_at TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS copycat_postings (
        fp INTEGER NOT NULL, pr INTEGER NOT NULL, PRIMARY KEY (fp, pr)
    ) WITHOUT ROWID""",
    """CREATE INDEX IF NOT EXISTS copycat_postings_pr ON copycat_postings (pr)""",
    """CREATE TABLE IF NOT EXISTS copycat_lines (
        line INTEGER NOT NULL, pr INTEGER NOT NULL, PRIMARY KEY (line, pr)
    ) WITHOUT ROWID""",
    """CREATE INDEX IF NOT EXISTS copycat_lines_pr ON copycat_lines (pr)""",
    """CREATE TABLE IF NOT EXISTS copycat_main (fp INTEGER PRIMARY KEY, since TEXT NOT NULL) WITHOUT ROWID""",
)

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
    # one migrations list for every table in the file: the copycat index and the dispatch handles (created
    # by their modules until now, hence IF NOT EXISTS), and two tables nothing ever wrote (penalties: the
    # copycat strikes decide from the strikes themselves; poll_state: the listing keeps its ETag in memory)
    4: (
        """CREATE TABLE IF NOT EXISTS dispatch_runs (
            request_id TEXT PRIMARY KEY,
            pr INTEGER NOT NULL, head_sha TEXT NOT NULL, base_sha TEXT NOT NULL, rules_hash TEXT NOT NULL,
            profile TEXT NOT NULL, attempt INTEGER NOT NULL, exclude_runners TEXT NOT NULL,
            workflow TEXT NOT NULL, ref TEXT NOT NULL, dispatched_at TEXT NOT NULL, deadline TEXT NOT NULL,
            run_id INTEGER, runner_name TEXT, html_url TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('dispatching', 'in_flight', 'finished', 'failed', 'retried')),
            note TEXT NOT NULL, retried_as TEXT, updated_at TEXT NOT NULL
        ) STRICT""",
        """CREATE INDEX IF NOT EXISTS dispatch_runs_by_state ON dispatch_runs (state)""",
        """CREATE INDEX IF NOT EXISTS dispatch_runs_by_eval ON dispatch_runs (pr, head_sha, base_sha, rules_hash)""",
        *COPYCAT_TABLES,
        """DROP TABLE IF EXISTS penalties""",
        """DROP TABLE IF EXISTS poll_state""",
    ),
    # leases held inside the file (evalbot.store.lease): one poller per store, whatever path opened it
    5: (
        """CREATE TABLE leases (
            name TEXT PRIMARY KEY, owner TEXT NOT NULL, acquired_at TEXT NOT NULL, heartbeat_at TEXT NOT NULL,
            expires_at TEXT NOT NULL
        ) STRICT""",
    ),
    # credits per scored track (tracks.yaml): a merged PR that led a track's round, with that track's gain
    6: (
        """CREATE TABLE track_credits (
            id INTEGER PRIMARY KEY, track TEXT NOT NULL, pr INTEGER NOT NULL, sha TEXT NOT NULL,
            author TEXT NOT NULL, gain REAL, at TEXT NOT NULL, UNIQUE (track, pr, sha)
        ) STRICT""",
    ),
}
_TABLES = frozenset(
    [
        "meta",
        "evaluations",
        "actions",
        "strikes",
        "blocklist_events",
        "rounds",
        "round_members",
        "ledger",
        "holds",
        "clears",
        "calibrations",
        "dispatch_runs",
        "copycat_prs",
        "copycat_postings",
        "copycat_lines",
        "copycat_main",
        "leases",
        "track_credits",
    ]
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


def iso(moment: datetime | None = None) -> str:
    """A timezone-aware moment (default: now) in the one text form (evalbot.times): 2026-11-30T10:00:00.000000Z."""
    return times.stamp(moment)


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


class ClosedOnExit(ABC):
    """Closes on leaving a ``with`` block."""

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Db(ClosedOnExit):
    """The store's file: one connection, its migrations and its transactions, shared by every part of the
    store (each part owns its tables and runs its SQL through ``write``, ``read`` and ``one``)."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        self.path = Path(path)
        self.in_memory = os.fspath(path) == MEMORY
        self._busy_timeout_ms = int(busy_timeout_ms)
        if not self.in_memory:
            _check_file(self.path)
        try:
            self._conn = sqlite3.connect(
                MEMORY if self.in_memory else self.path,
                timeout=busy_timeout_ms / 1000,
                isolation_level=None,
                check_same_thread=True,
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
        if (
            self.in_memory
        ):  # nothing to check or make durable: a private database that ends with its connection
            conn.execute("PRAGMA foreign_keys = ON")
            self._migrate()
            return
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
        with self.write() as conn:
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

    def open_connection(self) -> sqlite3.Connection:
        """A second connection to the store's file with its pragmas, for a thread of its own (the lease's
        heartbeat): autocommit, its writes one ``transaction(conn, path)`` each."""
        if self.in_memory:
            raise StoreError("a store in memory has one connection; open a file for a second one")
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout_ms / 1000, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    def close(self) -> None:
        """Close the connection; the WAL is checkpointed by SQLite when the last connection closes."""
        self._conn.close()

    def write(self) -> AbstractContextManager[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: committed when the block ends, rolled back if it raises."""
        return transaction(self._conn, self.path)

    def read(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        """The rows of one query, outside any write (each column by name or by place)."""
        cur = self._conn.execute(sql, params)
        cur.row_factory = sqlite3.Row
        return cur.fetchall()

    def records(self, record: Callable[..., T], sql: str, params: tuple[Any, ...] = ()) -> list[T]:
        """The rows of one query, each made into ``record(**columns)``."""
        return [record(**dict(r)) for r in self.read(sql, params)]

    def one(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Row | None:
        """The first row of one query, or None."""
        rows = self.read(sql, params)
        return rows[0] if rows else None

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
        with self.write() as conn:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )


@contextmanager
def transaction(conn: sqlite3.Connection, path: Path) -> Iterator[sqlite3.Connection]:
    """One ``BEGIN IMMEDIATE`` transaction on an autocommit connection (the store's, or a second one from
    ``Db.open_connection``): committed when the block ends, rolled back if it raises."""
    # IMMEDIATE takes the write lock up front: a deferred transaction that later needs it could fail
    # with SQLITE_BUSY halfway, after reads that the busy timeout cannot retry.
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        raise StoreBusyError(
            f"{path}: another process held the store's write lock past the busy timeout ({exc})"
        ) from None
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


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
        raise CorruptStoreError(
            f"{path}: the state file is empty (0 bytes), not a new store; refusing to open "
            "it (restore it from a backup, or delete it to start a new one)"
        )
    if header[: len(_HEADER)] != _HEADER:
        raise CorruptStoreError(
            f"{path}: not a SQLite database (it starts with {header[:16]!r}); refusing to open or overwrite it"
        )
    page = int.from_bytes(header[16:18], "big") if len(header) >= 18 else 0
    page = 65536 if page == 1 else page
    pages = int.from_bytes(header[28:32], "big") if len(header) >= 100 else 0
    valid = len(header) >= 100 and header[24:28] == header[92:96]  # the in-header size is trustworthy
    if len(header) < 100 or page < 512 or size % page or (valid and size < page * pages):
        raise CorruptStoreError(
            f"{path}: the state file is truncated ({size} bytes; its header says "
            f"{pages} pages of {page}); refusing to open it"
        )
