"""The blocklist has one source, the store; blocked-contributors.txt is its export, and a maintainer's
hand edit of the file (a line added, a line removed) comes back as a block or an unblock."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from evalbot.ledgers import (
    BLOCKED_PATH,
    BlockedEntry,
    commit_ledgers,
    parse_blocked,
    read_ledgers,
    reconcile_blocked,
)
from evalbot.ledgers.book import BY_FILE, LedgerBook
from evalbot.store import Store

T0 = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
E = BlockedEntry


def logins(entries) -> list[str]:
    return [e.login for e in entries]


def test_before_the_first_export_hand_lines_are_blocks_and_the_stores_unblocks_win():
    # eve was unblocked in the store; the file still lists her: the unblock wins, the line goes
    plan = reconcile_blocked([E("eve"), E("hand", "copies")], None, [E("mallory")], known={"eve", "mallory"})
    assert logins(plan.block) == ["hand"] and plan.lift == ()
    assert logins(plan.blocked) == ["hand", "mallory"]


def test_after_an_export_a_removed_line_lifts_and_an_unexported_block_is_written():
    # the bot last wrote [eve, mallory]; a maintainer deleted eve's line; the store blocked zed since
    plan = reconcile_blocked([E("mallory")], ["eve", "mallory"], [E("eve"), E("mallory"), E("zed")])
    assert plan.block == () and plan.lift == ("eve",)
    assert logins(plan.blocked) == ["mallory", "zed"]


def test_logins_compare_without_case():
    plan = reconcile_blocked([E("Mallory")], ["mallory"], [E("mallory")])
    assert plan.block == () and plan.lift == () and logins(plan.blocked) == ["mallory"]


@pytest.fixture
def remote(tmp_path: Path) -> str:
    bare = tmp_path / "ledgers.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    return bare.as_uri()


def test_the_store_is_the_source_and_the_file_its_export(tmp_path: Path, remote: str):
    log: list[str] = []
    with Store(tmp_path / "s.db") as store:
        book = LedgerBook(store, remote, log.append, lambda: T0)
        store.moderation.block("mallory", "copycat strikes", "evalbot", T0)
        book.sync_blocked()
        assert logins(parse_blocked(read_ledgers(remote)[BLOCKED_PATH])) == ["mallory"]

        # a maintainer adds a line by hand: the next poll blocks in the store, and keeps the line
        commit_ledgers(
            remote, {BLOCKED_PATH: read_ledgers(remote)[BLOCKED_PATH] + "eve  # sock puppet\n"}, "hand"
        )
        book.begin_poll()
        book.sync_blocked()
        assert book.blocked() == {"eve", "mallory"}
        assert [(e.login, e.by) for e in store.moderation.blocklist()] == [
            ("eve", BY_FILE),
            ("mallory", "evalbot"),
        ]

        # and removes mallory's: the store lifts the block, and the history keeps both
        commit_ledgers(remote, {BLOCKED_PATH: "eve\n"}, "hand")
        book.begin_poll()
        book.sync_blocked()
        assert book.blocked() == {"eve"}
        assert [e.event for e in store.moderation.blocklist_history("mallory")] == ["block", "unblock"]

        # an unblock in the store removes the line from the file
        store.moderation.unblock("eve", "a mistake", "maint", T0)
        book.begin_poll()
        book.sync_blocked()
        assert parse_blocked(read_ledgers(remote)[BLOCKED_PATH]) == [] and book.blocked() == frozenset()
    assert any("added to" in line for line in log) and any("removed from" in line for line in log)


def test_an_unreadable_ledger_costs_the_export_never_a_block(tmp_path: Path):
    with Store(tmp_path / "s.db") as store:
        store.moderation.block("mallory", "copycat strikes", "evalbot", T0)
        book = LedgerBook(store, (tmp_path / "missing.git").as_uri(), lambda _: None, lambda: T0)
        with pytest.raises(Exception):  # noqa: B017 - the poller contains it and notes it
            book.sync_blocked()
        assert book.blocked() == {"mallory"}


def test_a_dry_run_reads_hand_edits_but_writes_nothing(tmp_path: Path, remote: str):
    commit_ledgers(remote, {BLOCKED_PATH: "eve\n"}, "hand")
    with Store(tmp_path / "s.db") as store:
        book = LedgerBook(store, remote, lambda _: None, lambda: T0, dry_run=True)
        book.sync_blocked()
        assert book.blocked() == {"eve"} and store.moderation.blocklist() == []
    assert read_ledgers(remote)[BLOCKED_PATH] == "eve\n"
