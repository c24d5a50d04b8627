"""The ledgers the bot keeps in the repository: `.github/FLAGGED.md` and `.github/blocked-contributors.txt`.

- ``files``: the two files (render, parse, the blocklist's reconciliation: pure) and their git branch I/O;
- ``book``: the files as the poller keeps them, read at most once a poll, with the store as the blocklist's
  one source and the file as its export.

Code outside the package imports from here.
"""

from __future__ import annotations

from evalbot.ledgers.book import BY_FILE, LedgerBook
from evalbot.ledgers.files import (
    BLOCKED_PATH,
    FLAGGED_PATH,
    LEDGER_BRANCH,
    BlockedEntry,
    BlockedSync,
    FlagEntry,
    LedgerError,
    clear,
    commit_ledgers,
    flag,
    parse_blocked,
    parse_flagged,
    read_ledgers,
    reconcile_blocked,
    render_blocked,
    render_flagged,
)

__all__ = [
    "BLOCKED_PATH",
    "BY_FILE",
    "FLAGGED_PATH",
    "LEDGER_BRANCH",
    "BlockedEntry",
    "BlockedSync",
    "FlagEntry",
    "LedgerBook",
    "LedgerError",
    "clear",
    "commit_ledgers",
    "flag",
    "parse_blocked",
    "parse_flagged",
    "read_ledgers",
    "reconcile_blocked",
    "render_blocked",
    "render_flagged",
]
