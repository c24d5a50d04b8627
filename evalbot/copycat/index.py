"""The copycat inverted index in SQLite: fingerprint -> PRs, literal line -> PRs, and main's k-grams.

A check reads only the rows of the new PR's own fingerprints and lines, and for each fingerprint at
most ``boilerplate_max_prs + 1`` postings, so it costs O(size of the PR) whatever the number of PRs.
The connection belongs to the caller (the store): the store's migrations create the ``copycat_*`` tables,
and journal mode, transactions across calls and connection lifetime are the store's too.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator

from evalbot.copycat.containment import CopycatFinding, Evidence, PrMeta, assess, size_in_lines, utc
from evalbot.copycat.containment import before as is_before
from evalbot.copycat.fingerprint import PrPrint, fingerprint_pr
from evalbot.model import PullRequest
from evalbot.rules import Rules
from evalbot.store import create_copycat_tables, require_tables

_TABLES = (
    "copycat_prs",
    "copycat_postings",
    "copycat_lines",
    "copycat_main",
)  # the store's migrations make them

# A tiny PR is compared literally with the PRs holding its rarest line; a line in more PRs than
# this is idiom (`return out`), and a PR made only of such lines is not looked up literally.
LITERAL_SCAN_CAP = 1000
# Non-tiny PRs get their literal overlap with this many best fingerprint candidates (for the report).
LITERAL_REPORT_TOP = 5


class CopycatIndex:
    """Fingerprints of every PR seen, main's k-grams with the time each appeared, and PR states."""

    def __init__(self, conn: sqlite3.Connection):
        require_tables(conn, _TABLES, "the copycat index")
        self.conn = conn

    @classmethod
    def in_memory(cls) -> CopycatIndex:
        """An index of its own, in memory (one scan of a folder of diffs, a test)."""
        conn = sqlite3.connect(":memory:")
        create_copycat_tables(conn)
        return cls(conn)

    def add(self, meta: PrMeta, prints: PrPrint) -> None:
        """Index a PR's fingerprints and lines, replacing what an earlier push of it had."""
        with self.conn:
            self._forget(meta.number)
            self.conn.execute(
                "INSERT INTO copycat_prs (number, author, created_at, merged_at, closed_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (meta.number, meta.author, meta.created_at, meta.merged_at, meta.closed_at),
            )
            self.conn.executemany(
                "INSERT INTO copycat_postings (fp, pr) VALUES (?, ?)",
                ((h, meta.number) for h in prints.hashes),
            )
            self.conn.executemany(
                "INSERT INTO copycat_lines (line, pr) VALUES (?, ?)",
                ((h, meta.number) for h in prints.literal),
            )

    def remove(self, number: int) -> None:
        """Forget a PR entirely."""
        with self.conn:
            self._forget(number)

    def mark_merged(self, number: int, at: str) -> None:
        """Record that a PR merged: its code is base code for PRs opened after ``at``."""
        with self.conn:
            self.conn.execute(
                "UPDATE copycat_prs SET merged_at = ?, closed_at = coalesce(closed_at, ?) WHERE number = ?",
                (utc(at), utc(at), number),
            )

    def set_main(self, kgrams: Iterable[int], at: str) -> None:
        """Main's k-grams now: new ones are base code from ``at`` on, vanished ones no longer are."""
        at = utc(at)
        with self.conn:
            self.conn.execute("CREATE TEMP TABLE IF NOT EXISTS copycat_main_now (fp INTEGER PRIMARY KEY)")
            self.conn.execute("DELETE FROM copycat_main_now")
            self.conn.executemany(
                "INSERT OR IGNORE INTO copycat_main_now (fp) VALUES (?)", ((h,) for h in kgrams)
            )
            self.conn.execute("DELETE FROM copycat_main WHERE fp NOT IN (SELECT fp FROM copycat_main_now)")
            self.conn.execute(
                "INSERT OR IGNORE INTO copycat_main (fp, since) SELECT fp, ? FROM copycat_main_now", (at,)
            )
            self.conn.execute("DELETE FROM copycat_main_now")

    def document_frequency(
        self, fingerprints: Iterable[int], cap: int, exclude: int | None = None
    ) -> dict[int, int]:
        """How many PRs (other than ``exclude``) hold each fingerprint, counted up to ``cap``."""
        rows = self.conn.execute(
            """SELECT q.value, (SELECT count(*) FROM (
                   SELECT 1 FROM copycat_postings p WHERE p.fp = q.value AND p.pr IS NOT ? LIMIT ?))
               FROM json_each(?) q""",
            (exclude, cap, _json(fingerprints)),
        )
        return dict(rows)

    def candidates(
        self,
        fingerprints: Iterable[int],
        boilerplate_max_prs: int,
        *,
        before: str | None = None,
        exclude: int | None = None,
    ) -> dict[int, int]:
        """Per PR (opened before ``before``) how many of these fingerprints it has, boilerplate aside."""
        counts: dict[int, int] = {}
        for _, pr in self._postings(fingerprints, boilerplate_max_prs, exclude):
            counts[pr] = counts.get(pr, 0) + 1
        if before is None or not counts:
            return counts
        earlier = self._metas(counts)
        return {n: c for n, c in counts.items() if is_before(earlier[n].created_at, before)}

    def evidence(self, new: PrPrint, meta: PrMeta, boilerplate_max_prs: int, tiny_below: int) -> Evidence:
        """What the index knows about a new PR's fingerprints and lines, as ``copycat.assess`` needs it."""
        main = {
            h
            for (h,) in self.conn.execute(
                "SELECT q.value FROM json_each(?) q JOIN copycat_main m ON m.fp = q.value WHERE m.since <= ?",
                (_json(new.hashes), meta.created_at),
            )
        }
        rest = new.hashes - main
        df = self.document_frequency(rest, boilerplate_max_prs + 1, exclude=meta.number)
        boilerplate = frozenset(h for h, c in df.items() if c > boilerplate_max_prs)
        shared: dict[int, set[int]] = {}
        for h, pr in self._postings(rest - boilerplate, None, meta.number):
            shared.setdefault(pr, set()).add(h)
        others = self._metas(shared)
        merged = frozenset().union(
            *(
                shared[n]
                for n, m in others.items()
                if m.merged_at is not None and m.merged_at <= meta.created_at
            )
        )
        literal = self._literal(new, meta, shared, tiny_below)
        others |= self._metas(set(literal) - set(others))
        return Evidence(
            main=frozenset(main),
            boilerplate=boilerplate,
            merged=merged,
            shared={n: frozenset(s) for n, s in shared.items()},
            literal=literal,
            others=others,
        )

    def _literal(
        self, new: PrPrint, meta: PrMeta, shared: dict[int, set[int]], tiny_below: int
    ) -> dict[int, int]:
        """Literal line counts: tiny PRs' with all PRs holding their rarest line; others' with the top few."""
        lines = _json(new.literal)
        if size_in_lines(new) < tiny_below:
            rarest = self.conn.execute(
                """SELECT q.value, (SELECT count(*) FROM (
                       SELECT 1 FROM copycat_lines l WHERE l.line = q.value AND l.pr != ? LIMIT ?)) AS n
                   FROM json_each(?) q ORDER BY n, q.value LIMIT 1""",
                (meta.number, LITERAL_SCAN_CAP + 1, lines),
            ).fetchone()
            if rarest is None or rarest[1] > LITERAL_SCAN_CAP:
                return {}
            prs = [
                pr
                for (pr,) in self.conn.execute(
                    "SELECT pr FROM copycat_lines WHERE line = ? AND pr != ?", (rarest[0], meta.number)
                )
            ]
        else:
            prs = sorted(shared, key=lambda n: (-len(shared[n]), n))[:LITERAL_REPORT_TOP]
        out = {}
        for pr in prs:
            (n,) = self.conn.execute(
                "SELECT count(*) FROM json_each(?) q JOIN copycat_lines l ON l.line = q.value AND l.pr = ?",
                (lines, pr),
            ).fetchone()
            if n:
                out[pr] = n
        return out

    def _postings(
        self, fingerprints: Iterable[int], boilerplate_max_prs: int | None, exclude: int | None
    ) -> Iterator[tuple[int, int]]:
        """(fingerprint, PR) rows, skipping fingerprints held by more than boilerplate_max_prs other PRs."""
        fps = list(fingerprints)
        if boilerplate_max_prs is not None:
            df = self.document_frequency(fps, boilerplate_max_prs + 1, exclude)
            fps = [h for h in fps if df[h] <= boilerplate_max_prs]
        yield from self.conn.execute(
            "SELECT p.fp, p.pr FROM json_each(?) q JOIN copycat_postings p ON p.fp = q.value"
            " WHERE p.pr IS NOT ?",
            (_json(fps), exclude),
        )

    def _metas(self, numbers: Iterable[int]) -> dict[int, PrMeta]:
        rows = self.conn.execute(
            """SELECT number, author, created_at, merged_at, closed_at FROM copycat_prs
               WHERE number IN (SELECT value FROM json_each(?))""",
            (_json(numbers),),
        )
        return {r[0]: PrMeta(*r) for r in rows}

    def _forget(self, number: int) -> None:
        self.conn.execute("DELETE FROM copycat_postings WHERE pr = ?", (number,))
        self.conn.execute("DELETE FROM copycat_lines WHERE pr = ?", (number,))
        self.conn.execute("DELETE FROM copycat_prs WHERE number = ?", (number,))


def check(
    index: CopycatIndex, pr: PullRequest, rules: Rules, prior_warnings: int = 0
) -> tuple[CopycatFinding, PrPrint]:
    """Check a PR against the index (read only); returns the finding and the prints to ``add`` afterwards."""
    cfg = rules.copycat
    new, meta = fingerprint_pr(pr, cfg.winnowing.k, cfg.winnowing.w), PrMeta.of(pr)
    evidence = index.evidence(new, meta, cfg.boilerplate_max_prs, cfg.tiny_pr.below_added_lines)
    return assess(new, meta, evidence, rules, prior_warnings), new


def _json(values: Iterable[int]) -> str:
    return json.dumps(sorted(values))
