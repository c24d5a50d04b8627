"""Leases held inside the store: one poller per state file, whatever path each was opened by.

A lease is a row (name, owner, heartbeat, expiry) in the store's own file, so two bots that reach the same
file through a symlink, `./state.db` and an absolute path, or two hosts on one shared disk, meet at the
same row: a lock file beside the state, named after the path as typed, did not. The holder renews its
heartbeat (`LeaseKeeper`, a thread with its own connection, so an evaluation that runs for many minutes
keeps it); a lease whose expiry has passed belongs to nobody, and one whose holder is known to be gone (the
caller says how: the CLI checks for a dead process on this host) is taken over at once. Every change is one
`BEGIN IMMEDIATE` transaction, so two contenders never both win.

An owner names the very process (and object) that holds the lease: `worker_id()`, host:pid:random, is the
default identity of every bot, whoever builds it, so two bots never take each other for themselves.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from evalbot import times
from evalbot.store.db import Db, StoreError, _check_text, transaction

POLLER = "poller"


def worker_id() -> str:
    """A fresh holder identity (host, pid, a random part): a lease or a claim names the very holder."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{secrets.token_hex(3)}"


def owner_gone(owner: str) -> bool:
    """Whether a lease owner (a worker id, host:pid:random) is a process of this host that no longer runs:
    its lease is taken over at once instead of when it lapses. Another host's owner is never judged here."""
    parts = owner.split(":")
    if len(parts) != 3 or parts[0] != socket.gethostname()[:40] or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class LeaseHeldError(StoreError):
    """Another live owner holds the lease; the message names it, its last heartbeat and its expiry."""

    def __init__(self, message: str, holder: LeaseRecord):
        super().__init__(message)
        self.holder = holder


class LeaseLostError(StoreError):
    """This owner's lease expired and another took it over: stop acting on the store's behalf."""


@dataclass(frozen=True)
class LeaseRecord:
    """Who holds a lease, since when, its last heartbeat, and when it lapses without another."""

    name: str
    owner: str
    acquired_at: datetime
    heartbeat_at: datetime
    expires_at: datetime

    def describe(self, now: datetime) -> str:
        """`owner (heartbeat 12 s ago, lapses in 78 s)`."""
        beat = (now - self.heartbeat_at).total_seconds()
        left = (self.expires_at - now).total_seconds()
        lapse = f"lapses in {left:.0f} s" if left > 0 else f"lapsed {-left:.0f} s ago"
        return f"{self.owner} (since {times.stamp(self.acquired_at)}, heartbeat {beat:.0f} s ago, {lapse})"


def _row(r: sqlite3.Row | tuple) -> LeaseRecord:
    return LeaseRecord(r[0], r[1], times.parse(r[2]), times.parse(r[3]), times.parse(r[4]))


_SELECT = "SELECT name, owner, acquired_at, heartbeat_at, expires_at FROM leases WHERE name = ?"


class Leases:
    """Named leases in the store's file."""

    def __init__(self, db: Db) -> None:
        self._db = db

    @property
    def path(self) -> Path:
        """The store's file, which holds the leases."""
        return self._db.path

    def current(self, name: str = POLLER) -> LeaseRecord | None:
        """The lease's current row (expired or not), or None."""
        row = self._db.one(_SELECT, (name,))
        return None if row is None else _row(row)

    def acquire(
        self,
        owner: str,
        ttl_s: float,
        *,
        name: str = POLLER,
        now: datetime | None = None,
        gone: Callable[[str], bool] = lambda _owner: False,
    ) -> LeaseRecord:
        """Take the lease for `owner` (or renew it, if already `owner`'s) until now + ttl_s. A lease another
        owner holds is taken over only once it has lapsed or `gone(owner)` says that owner no longer runs;
        otherwise LeaseHeldError names the holder."""
        _check_text(owner, "lease owner")
        if not ttl_s > 0:
            raise ValueError(f"lease ttl must be positive, got {ttl_s!r}")
        at = now or times.now()
        with self._db.write() as conn:
            row = conn.execute(_SELECT, (name,)).fetchone()
            held = None if row is None else _row(row)
            if held is not None and held.owner != owner and held.expires_at > at and not gone(held.owner):
                raise LeaseHeldError(
                    f"the {name} lease of {self._db.path} is held by {held.describe(at)}", held
                )
            acquired = held.acquired_at if held is not None and held.owner == owner else at
            conn.execute(
                "INSERT INTO leases (name, owner, acquired_at, heartbeat_at, expires_at) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, acquired_at = excluded.acquired_at, "
                "heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at",
                (
                    name,
                    owner,
                    times.stamp(acquired),
                    times.stamp(at),
                    times.stamp(at + timedelta(seconds=ttl_s)),
                ),
            )
        return LeaseRecord(name, owner, acquired, at, at + timedelta(seconds=ttl_s))

    def release(self, owner: str, *, name: str = POLLER) -> bool:
        """Give the lease up if `owner` holds it; True if it did."""
        with self._db.write() as conn:
            return conn.execute("DELETE FROM leases WHERE name = ? AND owner = ?", (name, owner)).rowcount > 0

    def heartbeat(self) -> Heartbeat:
        """A connection of its own to renew leases from another thread (LeaseKeeper's); close it after."""
        return Heartbeat(self._db.open_connection(), self._db.path)


class Heartbeat:
    """Renews leases on a connection of its own, so a thread can keep a lease while the store's connection
    belongs to the thread that opened it."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn, self._path = conn, path

    def renew(self, name: str, owner: str, ttl_s: float, now: datetime | None = None) -> bool:
        """Move `owner`'s heartbeat and expiry on; False if `owner` no longer holds the lease (it lapsed and
        another took it)."""
        at = now or times.now()
        with transaction(self._conn, self._path) as conn:
            cur = conn.execute(
                "UPDATE leases SET heartbeat_at = ?, expires_at = ? WHERE name = ? AND owner = ?",
                (times.stamp(at), times.stamp(at + timedelta(seconds=ttl_s)), name, owner),
            )
            return cur.rowcount > 0

    def close(self) -> None:
        self._conn.close()


class LeaseKeeper:
    """Holds a lease for as long as it runs: acquires it, renews the heartbeat every `ttl_s / 4` from a
    thread with its own connection, and releases it on `stop()`. `check()` raises LeaseLostError once a
    renewal found another owner, or a renewal could not be written for longer than the lease lasts."""

    def __init__(
        self,
        leases: Leases,
        owner: str,
        ttl_s: float,
        *,
        name: str = POLLER,
        gone: Callable[[str], bool] = lambda _owner: False,
    ):
        self.leases, self.owner, self.ttl_s, self.name, self.gone = leases, owner, ttl_s, name, gone
        self._stop = threading.Event()
        self._lost: str | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> LeaseRecord:
        """Acquire (LeaseHeldError if another live owner holds it) and start the heartbeat."""
        record = self.leases.acquire(self.owner, self.ttl_s, name=self.name, gone=self.gone)
        if self._thread is None:
            self._thread = threading.Thread(target=self._beat, name=f"lease-{self.name}", daemon=True)
            self._thread.start()
        return record

    def _beat(self) -> None:
        beat = self.leases.heartbeat()
        last_ok = times.now()
        try:
            while not self._stop.wait(self.ttl_s / 4):
                try:
                    if not beat.renew(self.name, self.owner, self.ttl_s):
                        self._lost = (
                            f"the {self.name} lease of {self.leases.path} was taken over by another owner"
                        )
                        return
                    last_ok = times.now()
                except (sqlite3.Error, StoreError) as exc:
                    if (times.now() - last_ok).total_seconds() > self.ttl_s:
                        self._lost = (
                            f"the {self.name} lease could not be renewed for {self.ttl_s:.0f} s: {exc}"
                        )
                        return
        finally:
            beat.close()

    def check(self) -> None:
        """Raise LeaseLostError if the lease is no longer this owner's."""
        if self._lost is not None:
            raise LeaseLostError(self._lost)

    def stop(self) -> None:
        """Stop the heartbeat and give the lease up (if still held)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._lost is None:
            with contextlib.suppress(StoreError):  # it lapses on its own
                self.leases.release(self.owner, name=self.name)
