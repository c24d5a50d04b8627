"""The ledger files as the bot keeps them: read at most once a poll, FLAGGED.md rows added, and the
blocklist synced.

The store is the blocklist's one source; `.github/blocked-contributors.txt` is its export. A maintainer's
hand edit of the file (a line added or removed) is read back into the store as a block or an unblock,
then the file is written from the store again. A ledger remote that cannot be read costs the export,
never a block: who is blocked is read from the store.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime

from evalbot.ledgers import files as ledgers
from evalbot.model import cap_text
from evalbot.rules import is_login
from evalbot.store import BlockEvent, Store

Log = Callable[[str], None]

EXPORTED_KEY = "ledger:blocked:exported"  # store meta: the logins the bot last wrote to the file (JSON)
BY_FILE = "blocked-contributors.txt"  # who a hand edit of the file is recorded as


class LedgerBook:
    """One bot's ledgers on `remote` (None: no ledger files; the store alone holds the blocklist)."""

    def __init__(self, store: Store, remote: str | None, log: Log, now: Callable[[], datetime], *,
                 dry_run: bool = False):  # fmt: skip
        self.store, self.remote, self.log, self.now, self.dry_run = store, remote, log, now, dry_run
        self._texts: dict[str, str] | None = None
        self._dry_blocked: tuple[ledgers.BlockedEntry, ...] | None = None  # a dry run's reading of hand edits

    def begin_poll(self) -> None:
        """Read the files again at the next use (a maintainer may have edited them since)."""
        self._texts = None

    def texts(self) -> dict[str, str]:
        if self._texts is None:
            self._texts = (ledgers.read_ledgers(self.remote) if self.remote
                           else {ledgers.FLAGGED_PATH: "", ledgers.BLOCKED_PATH: ""})  # fmt: skip
        return self._texts

    def stored(self) -> list[BlockEvent]:
        """The store's blocked logins; a malformed one (written before logins were checked) is reported
        and skipped, never fatal."""
        out = []
        for e in self.store.moderation.blocklist():
            if is_login(e.login):
                out.append(e)
            else:
                self.log(f"state: blocked login {e.login[:60]!r} is not a GitHub login; skipped")
        return out

    def blocked(self) -> frozenset[str]:
        """Who is blocked now: the store's list (a dry run adds the file's unsynced hand edits)."""
        if self._dry_blocked is not None:
            return frozenset(e.login for e in self._dry_blocked)
        return frozenset(e.login for e in self.stored())

    def sync_blocked(self) -> ledgers.BlockedSync | None:
        """Read the file's hand edits into the store, then write the store's list to the file."""
        if not self.remote:
            return None
        listed = ledgers.parse_blocked(self.texts()[ledgers.BLOCKED_PATH], self.log)
        raw = self.store.meta(EXPORTED_KEY)
        exported = _logins(raw)
        known = {e.login for e in self.store.moderation.blocklist_history()}
        plan = ledgers.reconcile_blocked(
            listed, exported, [ledgers.BlockedEntry(e.login, e.reason) for e in self.stored()], known
        )
        if self.dry_run:
            self._dry_blocked = plan.blocked
            return plan
        for e in plan.block:
            reason = cap_text(e.reason, 300) if e.reason.strip() else f"listed in {BY_FILE}"
            self.store.moderation.block(e.login, reason, BY_FILE, self.now())
            self.log(f"blocklist: {e.login} added to {BY_FILE} by hand; blocked")
        for login in plan.lift:
            self.store.moderation.unblock(login, f"removed from {BY_FILE}", BY_FILE, self.now())
            self.log(f"blocklist: {login} removed from {BY_FILE} by hand; unblocked")
        text = ledgers.render_blocked(plan.blocked)
        if text != self.texts()[ledgers.BLOCKED_PATH]:
            was = {e.login.lower() for e in listed}
            now = {e.login.lower() for e in plan.blocked}
            added = [e.login for e in plan.blocked if e.login.lower() not in was]
            gone = [e.login for e in listed if e.login.lower() not in now]
            words = [
                f"block {', '.join(added)}" if added else "",
                f"unblock {', '.join(gone)}" if gone else "",
            ]
            self._commit(
                ledgers.BLOCKED_PATH,
                text,
                "ledgers: " + ("; ".join(w for w in words if w) or "the blocklist as the bot keeps it"),
            )
        self.store.set_meta(EXPORTED_KEY, json.dumps(sorted(e.login for e in plan.blocked)))
        return plan

    def flag(self, pr: int, author: str, label: str, reason: str) -> None:
        """A FLAGGED.md row for the PR (once per PR and label)."""
        if not self.remote or self.dry_run:
            return
        entries = ledgers.parse_flagged(self.texts()[ledgers.FLAGGED_PATH])
        entry = ledgers.FlagEntry(self.now().strftime("%Y-%m-%d"), pr, author, label, reason)
        updated = ledgers.flag(entries, entry)
        if updated is not entries:
            self._commit(
                ledgers.FLAGGED_PATH, ledgers.render_flagged(updated), f"ledgers: flag #{pr} ({label})"
            )

    def _commit(self, path: str, text: str, message: str) -> None:
        assert self.remote
        ledgers.commit_ledgers(self.remote, {path: text}, message)
        self.texts()[path] = text


def _logins(raw: str | None) -> list[str] | None:
    """The exported logins kept in the store's meta; None when never written or unreadable (then the
    first-export rule applies again, which never lifts a block)."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return [x for x in data if isinstance(x, str)] if isinstance(data, list) else None
