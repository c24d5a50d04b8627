"""The copycat index's tables: fingerprint -> PRs, literal line -> PRs, main's k-grams, and the PRs' times.

Every query reads only the rows of the fingerprints or lines it is given (joined through ``json_each``),
and counts are capped, so a lookup costs O(size of the PR) whatever the number of PRs indexed. What the
rows mean (base code, boilerplate, eligibility) is ``evalbot.copycat``'s: this part stores and looks up.
Times are written as given (``evalbot.copycat`` hands them over in the one text form of evalbot.times).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass

from evalbot.store.db import Db


@dataclass(frozen=True)
class CopycatPr:
    """An indexed PR's times: opened, merged (its code is base code from then on), closed."""

    number: int
    author: str
    created_at: str
    merged_at: str | None
    closed_at: str | None


class CopycatTables:
    """The copycat index's part of the store."""

    def __init__(self, db: Db) -> None:
        self._db = db

    def add(self, pr: CopycatPr, fingerprints: Iterable[int], lines: Iterable[int]) -> None:
        """Index a PR's fingerprints and literal lines, replacing what an earlier push of it had."""
        with self._db.write() as conn:
            _forget(conn, pr.number)
            conn.execute(
                "INSERT INTO copycat_prs (number, author, created_at, merged_at, closed_at) VALUES (?, ?, ?, ?, ?)",
                (pr.number, pr.author, pr.created_at, pr.merged_at, pr.closed_at),
            )
            conn.executemany(
                "INSERT INTO copycat_postings (fp, pr) VALUES (?, ?)", ((h, pr.number) for h in fingerprints)
            )
            conn.executemany(
                "INSERT INTO copycat_lines (line, pr) VALUES (?, ?)", ((h, pr.number) for h in lines)
            )

    def remove(self, number: int) -> None:
        """Forget a PR entirely."""
        with self._db.write() as conn:
            _forget(conn, number)

    def mark_merged(self, number: int, at: str) -> None:
        """Record that a PR merged at ``at`` (and closed then, unless it closed earlier)."""
        with self._db.write() as conn:
            conn.execute(
                "UPDATE copycat_prs SET merged_at = ?, closed_at = coalesce(closed_at, ?) WHERE number = ?",
                (at, at, number),
            )

    def set_main(self, kgrams: Iterable[int], at: str) -> None:
        """Main's k-grams now: new ones are in main from ``at`` on, vanished ones are forgotten."""
        with self._db.write() as conn:
            conn.execute("CREATE TEMP TABLE IF NOT EXISTS copycat_main_now (fp INTEGER PRIMARY KEY)")
            conn.execute("DELETE FROM copycat_main_now")
            conn.executemany("INSERT OR IGNORE INTO copycat_main_now (fp) VALUES (?)", ((h,) for h in kgrams))
            conn.execute("DELETE FROM copycat_main WHERE fp NOT IN (SELECT fp FROM copycat_main_now)")
            conn.execute(
                "INSERT OR IGNORE INTO copycat_main (fp, since) SELECT fp, ? FROM copycat_main_now", (at,)
            )
            conn.execute("DELETE FROM copycat_main_now")

    def in_main(self, fingerprints: Iterable[int], by: str) -> set[int]:
        """Those of the fingerprints that were in main at ``by``."""
        rows = self._db.read(
            "SELECT q.value FROM json_each(?) q JOIN copycat_main m ON m.fp = q.value WHERE julianday(m.since) <= julianday(?)",
            (_json(fingerprints), by),
        )
        return {r[0] for r in rows}

    def document_frequency(
        self, fingerprints: Iterable[int], cap: int, exclude: int | None = None
    ) -> dict[int, int]:
        """How many PRs (other than ``exclude``) hold each fingerprint, counted up to ``cap``."""
        rows = self._db.read(
            """SELECT q.value, (SELECT count(*) FROM (
                   SELECT 1 FROM copycat_postings p WHERE p.fp = q.value AND p.pr IS NOT ? LIMIT ?))
               FROM json_each(?) q""",
            (exclude, cap, _json(fingerprints)),
        )
        return {r[0]: r[1] for r in rows}

    def postings(self, fingerprints: Iterable[int], exclude: int | None = None) -> list[tuple[int, int]]:
        """(fingerprint, PR) for every PR other than ``exclude`` that holds one of the fingerprints."""
        rows = self._db.read(
            "SELECT p.fp, p.pr FROM json_each(?) q JOIN copycat_postings p ON p.fp = q.value WHERE p.pr IS NOT ?",
            (_json(fingerprints), exclude),
        )
        return [(r[0], r[1]) for r in rows]

    def rarest_line(self, lines: Iterable[int], exclude: int, cap: int) -> tuple[int, int] | None:
        """The line held by the fewest other PRs, with that count (counted up to ``cap``); None: no lines."""
        row = self._db.one(
            """SELECT q.value, (SELECT count(*) FROM (
                   SELECT 1 FROM copycat_lines l WHERE l.line = q.value AND l.pr != ? LIMIT ?)) AS n
               FROM json_each(?) q ORDER BY n, q.value LIMIT 1""",
            (exclude, cap, _json(lines)),
        )
        return None if row is None else (row[0], row[1])

    def prs_with_line(self, line: int, exclude: int) -> list[int]:
        """The PRs other than ``exclude`` that hold a literal line."""
        rows = self._db.read("SELECT pr FROM copycat_lines WHERE line = ? AND pr != ?", (line, exclude))
        return [r[0] for r in rows]

    def lines_shared(self, lines: Iterable[int], pr: int) -> int:
        """How many of the lines PR ``pr`` holds."""
        row = self._db.one(
            "SELECT count(*) FROM json_each(?) q JOIN copycat_lines l ON l.line = q.value AND l.pr = ?",
            (_json(lines), pr),
        )
        return 0 if row is None else int(row[0])

    def prs(self, numbers: Iterable[int]) -> dict[int, CopycatPr]:
        """The indexed PRs among these numbers."""
        rows = self._db.read(
            """SELECT number, author, created_at, merged_at, closed_at FROM copycat_prs
               WHERE number IN (SELECT value FROM json_each(?))""",
            (_json(numbers),),
        )
        return {r[0]: CopycatPr(*r) for r in rows}


def _forget(conn: sqlite3.Connection, number: int) -> None:
    conn.execute("DELETE FROM copycat_postings WHERE pr = ?", (number,))
    conn.execute("DELETE FROM copycat_lines WHERE pr = ?", (number,))
    conn.execute("DELETE FROM copycat_prs WHERE number = ?", (number,))


def _json(values: Iterable[int]) -> str:
    return json.dumps(sorted(values))
