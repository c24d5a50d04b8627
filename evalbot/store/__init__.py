"""The bot's state in one SQLite file (WAL). ``Store`` opens it and holds its parts, each of which owns its
tables and runs their SQL through the one connection and transaction helper of ``db``:

- ``db``: opening the file safely, the one migrations list (every table in the file, the copycat index
  and dispatch handles included), transactions, the key-value meta table;
- ``store.queue``: evaluations, queued -> claimed (leased) -> done or gave_up;
- ``store.actions``: GitHub side effects in two phases, so a restart never repeats one;
- ``store.moderation``: strikes, the blocklist (its one source; the ledger file is an export), holds, clears;
- ``store.rounds``: rounds against one main, and the ledger of merges and credits;
- ``store.calibrations``: runner A/A calibrations;
- ``store.leases``: named leases in the file itself (one poller per store, whatever path it was opened by);
- ``store.dispatches``: evaluations dispatched to the runner pool, one row per attempt;
- ``store.copycat``: the copycat index (fingerprint and line postings, main's k-grams, PR times).

No module outside this package runs SQL or imports sqlite3 (an import contract holds it).
``Store.in_memory()`` is a private store with every table, for work that keeps nothing (an offline scan).

Durability. Every write is one ``BEGIN IMMEDIATE`` transaction, so a crash leaves each change whole or
absent. ``synchronous=FULL``: in WAL mode NORMAL may lose the last commits on power loss; a lost
"action done" row would make the bot post a comment or a strike twice. Writes are a few per poll, so
the extra fsync per commit costs nothing that matters. WAL lets ``evalbot status`` and other readers
read while the bot writes.

Times are written in one text form (evalbot.times) and compared in SQL through ``julianday()``, never as
text. Opening never overwrites: a file that is not SQLite, fails SQLite's integrity check, is some other
program's database, or has a newer schema than this code knows is refused with ``StoreError``.
"""

from __future__ import annotations

import os
from pathlib import Path

from evalbot.store.actions import ActionRecord, Actions, action_key
from evalbot.store.calibrations import Calibration, Calibrations
from evalbot.store.copycat import CopycatPr, CopycatTables
from evalbot.store.db import (
    BUSY_TIMEOUT_MS,
    MEMORY,
    SCHEMA_VERSION,
    ActionPendingError,
    ClosedOnExit,
    CorruptStoreError,
    Db,
    SchemaError,
    StoreBusyError,
    StoreError,
    iso,
)
from evalbot.store.dispatches import Dispatches, DispatchRow
from evalbot.store.lease import (
    POLLER,
    LeaseHeldError,
    LeaseKeeper,
    LeaseLostError,
    LeaseRecord,
    Leases,
    owner_gone,
    worker_id,
)
from evalbot.store.moderation import BlockEvent, Clear, Hold, Moderation, Strike
from evalbot.store.queue import DEFAULT_LEASE_S, DEFAULT_MAX_ATTEMPTS, EvalKey, EvaluationRecord, Queue
from evalbot.store.rounds import LedgerEntry, Round, RoundMember, Rounds, TrackCredit


class Store(ClosedOnExit):
    """The bot's SQLite state. Open with ``Store(path)``; use as a context manager or call ``close()``.
    Its parts share one connection: use the store from the thread that opened it."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        self.db = Db(path, busy_timeout_ms=busy_timeout_ms)
        self.path: Path = self.db.path
        self.queue = Queue(self.db)
        self.actions = Actions(self.db)
        self.moderation = Moderation(self.db)
        self.rounds = Rounds(self.db)
        self.calibrations = Calibrations(self.db)
        self.leases = Leases(self.db)
        self.dispatches = Dispatches(self.db)
        self.copycat = CopycatTables(self.db)

    @classmethod
    def in_memory(cls) -> Store:
        """A private store in memory with every table, gone when it is closed or dropped."""
        return cls(MEMORY)

    def meta(self, key: str) -> str | None:
        """A value from the key-value meta table, or None."""
        return self.db.meta(key)

    def set_meta(self, key: str, value: str) -> None:
        """Set a meta value; the schema version is the migrations' alone."""
        self.db.set_meta(key, value)

    def close(self) -> None:
        """Close the connection; the WAL is checkpointed by SQLite when the last connection closes."""
        self.db.close()


__all__ = [
    "BUSY_TIMEOUT_MS",
    "DEFAULT_LEASE_S",
    "DEFAULT_MAX_ATTEMPTS",
    "POLLER",
    "SCHEMA_VERSION",
    "ActionPendingError",
    "ActionRecord",
    "Actions",
    "BlockEvent",
    "Calibration",
    "Calibrations",
    "Clear",
    "CopycatPr",
    "CopycatTables",
    "CorruptStoreError",
    "DispatchRow",
    "Dispatches",
    "EvalKey",
    "EvaluationRecord",
    "Hold",
    "LeaseHeldError",
    "LeaseKeeper",
    "LeaseLostError",
    "LeaseRecord",
    "Leases",
    "LedgerEntry",
    "Moderation",
    "Queue",
    "Round",
    "RoundMember",
    "Rounds",
    "SchemaError",
    "Store",
    "StoreBusyError",
    "StoreError",
    "Strike",
    "TrackCredit",
    "action_key",
    "iso",
    "owner_gone",
    "worker_id",
]
