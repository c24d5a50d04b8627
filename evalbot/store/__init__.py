"""The bot's state in one SQLite file (WAL), in parts that each own their tables:

- ``db``: opening the file safely, the one migrations list (every table in the file, the copycat index
  and dispatch handles included), transactions;
- ``queue``: evaluations, queued -> claimed (leased) -> done or gave_up;
- ``actions``: GitHub side effects in two phases, so a restart never repeats one;
- ``moderation``: strikes, the blocklist (its one source; the ledger file is an export), holds, clears;
- ``rounds``: rounds against one main, and the ledger of merges and credits;
- ``calibrations``: runner A/A calibrations;
- ``lease``: named leases in the file itself (one poller per store, whatever path it was opened by).

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

from evalbot.store.actions import ActionRecord, Actions, action_key
from evalbot.store.calibrations import Calibration, Calibrations
from evalbot.store.db import (
    BUSY_TIMEOUT_MS,
    SCHEMA_VERSION,
    ActionPendingError,
    CorruptStoreError,
    SchemaError,
    StoreBusyError,
    StoreError,
    create_copycat_tables,
    iso,
    require_tables,
)
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
from evalbot.store.rounds import LedgerEntry, Round, RoundMember, Rounds


class Store(Queue, Actions, Moderation, Rounds, Calibrations, Leases):
    """The bot's SQLite state. Open with ``Store(path)``; use as a context manager or call ``close()``."""


__all__ = [
    "BUSY_TIMEOUT_MS",
    "DEFAULT_LEASE_S",
    "DEFAULT_MAX_ATTEMPTS",
    "SCHEMA_VERSION",
    "ActionPendingError",
    "ActionRecord",
    "BlockEvent",
    "Calibration",
    "Clear",
    "CorruptStoreError",
    "EvalKey",
    "EvaluationRecord",
    "Hold",
    "LeaseHeldError",
    "LeaseKeeper",
    "LeaseLostError",
    "LeaseRecord",
    "LedgerEntry",
    "POLLER",
    "Round",
    "RoundMember",
    "SchemaError",
    "Store",
    "StoreBusyError",
    "StoreError",
    "Strike",
    "action_key",
    "create_copycat_tables",
    "iso",
    "owner_gone",
    "require_tables",
    "worker_id",
]
