"""The FLAGGED.md and blocked-contributors.txt ledgers: round trips, hand edits, and commits to a real remote."""

import subprocess
from pathlib import Path

import pytest

from evalbot.ledgers import (
    BLOCKED_PATH,
    FLAGGED_PATH,
    LEDGER_BRANCH,
    BlockedEntry,
    FlagEntry,
    LedgerError,
    clear,
    commit_ledgers,
    flag,
    parse_blocked,
    parse_flagged,
    read_ledgers,
    render_blocked,
    render_flagged,
)


def test_flagged_round_trips_with_pipes_and_clears():
    entries = [
        FlagEntry("2026-11-30", 7, "mallory", "flagged:gaming", "commit author `eve` | blocked"),
        FlagEntry("2026-11-29", 3, "bob", "copycat", "94% of #2"),
    ]
    text = render_flagged(entries)
    assert text.index("#3") < text.index("#7")  # oldest first
    back = parse_flagged(text)
    assert sorted(back, key=lambda e: e.pr) == sorted(entries, key=lambda e: e.pr)
    cleared, n = clear(back, 7, "maintainer", "eve is a co-author, not the opener")
    assert n == 1 and [e.cleared for e in sorted(cleared, key=lambda e: e.pr)] == [False, True]
    assert parse_flagged(render_flagged(cleared)) == sorted(cleared, key=lambda e: (e.date, e.pr))
    assert (
        flag(cleared, FlagEntry("2026-12-01", 3, "bob", "copycat", "again")) == cleared
    )  # still open: no dup
    assert len(flag(cleared, FlagEntry("2026-12-01", 7, "mallory", "flagged:gaming", "again"))) == 3


def test_a_hand_edited_flagged_file_with_a_broken_row_names_the_line():
    text = render_flagged([FlagEntry("2026-11-30", 1, "a", "copycat", "x")]) + "| 2026-11-30 | 4 | a |\n"
    with pytest.raises(LedgerError, match=r"FLAGGED.md:\d+"):
        parse_flagged(text)


def test_blocked_round_trips_dedups_and_rejects_non_logins():
    text = render_blocked(
        [
            BlockedEntry("Mallory", "copied #12 three times"),
            BlockedEntry("eve"),
            BlockedEntry("mallory", "dup"),
        ]
    )
    assert parse_blocked(text) == [BlockedEntry("eve"), BlockedEntry("Mallory", "copied #12 three times")]
    assert parse_blocked("# only comments\n\n  octo-cat  # hand added\n") == [
        BlockedEntry("octo-cat", "hand added")
    ]
    problems: list[str] = []
    hostile = "ok\nnot a login!\n../x\n-x\n" + "a" * 200 + "\nalice#x\nbob alice\n"
    assert parse_blocked(hostile, problems.append) == [BlockedEntry("ok"), BlockedEntry("alice", "x")]
    assert [p.split(":")[1] for p in problems] == ["2", "3", "4", "5", "7"]  # reported by line, skipped


def test_commit_and_read_back_through_a_bare_remote(tmp_path: Path):
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    url = remote.as_uri()
    assert read_ledgers(url) == {FLAGGED_PATH: "", BLOCKED_PATH: ""}  # no branch yet
    files = {
        FLAGGED_PATH: render_flagged([FlagEntry("2026-11-30", 5, "eve", "copycat", "x")]),
        BLOCKED_PATH: render_blocked([BlockedEntry("eve", "strikes")]),
    }
    first = commit_ledgers(url, files, "ledgers: flag #5")
    assert first and read_ledgers(url) == files
    assert commit_ledgers(url, files, "no change") is None  # nothing to commit
    files[BLOCKED_PATH] = render_blocked([])
    second = commit_ledgers(url, files, "ledgers: unblock eve")
    log = subprocess.run(
        ["git", "-C", str(remote), "log", "--format=%s", LEDGER_BRANCH],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    assert second != first and log[:2] == ["ledgers: unblock eve", "ledgers: flag #5"]
    assert parse_blocked(read_ledgers(url)[BLOCKED_PATH]) == []
