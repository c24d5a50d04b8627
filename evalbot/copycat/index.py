"""The copycat inverted index: fingerprint -> PRs, literal line -> PRs, and main's k-grams, kept in the
store's copycat tables (``store.copycat``; ``CopycatIndex.in_memory()`` for an index of its own).

A check reads only the rows of the new PR's own fingerprints and lines, and for each fingerprint at
most ``boilerplate_max_prs + 1`` postings, so it costs O(size of the PR) whatever the number of PRs.
This module turns those rows into the ``Evidence`` that ``containment.assess`` decides from; the SQL is
the store's.
"""

from __future__ import annotations

from collections.abc import Iterable

from evalbot.copycat.containment import CopycatFinding, Evidence, PrMeta, assess, size_in_lines, utc
from evalbot.copycat.containment import before as is_before
from evalbot.copycat.fingerprint import PrPrint, fingerprint_pr
from evalbot.model import PullRequest
from evalbot.rules import Rules
from evalbot.store import CopycatPr, CopycatTables, Store

# A tiny PR is compared literally with the PRs holding its rarest line; a line in more PRs than
# this is idiom (`return out`), and a PR made only of such lines is not looked up literally.
LITERAL_SCAN_CAP = 1000
# Non-tiny PRs get their literal overlap with this many best fingerprint candidates (for the report).
LITERAL_REPORT_TOP = 5


class CopycatIndex:
    """Fingerprints of every PR seen, main's k-grams with the time each appeared, and PR states."""

    def __init__(self, tables: CopycatTables):
        self.tables = tables

    @classmethod
    def in_memory(cls) -> CopycatIndex:
        """An index of its own, in memory (one scan of a folder of diffs, a test)."""
        return cls(Store.in_memory().copycat)

    def add(self, meta: PrMeta, prints: PrPrint) -> None:
        """Index a PR's fingerprints and lines, replacing what an earlier push of it had."""
        row = CopycatPr(meta.number, meta.author, meta.created_at, meta.merged_at, meta.closed_at)
        self.tables.add(row, prints.hashes, prints.literal)

    def remove(self, number: int) -> None:
        """Forget a PR entirely."""
        self.tables.remove(number)

    def mark_merged(self, number: int, at: str) -> None:
        """Record that a PR merged: its code is base code for PRs opened after ``at``."""
        self.tables.mark_merged(number, utc(at))

    def set_main(self, kgrams: Iterable[int], at: str) -> None:
        """Main's k-grams now: new ones are base code from ``at`` on, vanished ones no longer are."""
        self.tables.set_main(kgrams, utc(at))

    def document_frequency(
        self, fingerprints: Iterable[int], cap: int, exclude: int | None = None
    ) -> dict[int, int]:
        """How many PRs (other than ``exclude``) hold each fingerprint, counted up to ``cap``."""
        return self.tables.document_frequency(fingerprints, cap, exclude)

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
        main = self.tables.in_main(new.hashes, meta.created_at)
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
        if size_in_lines(new) < tiny_below:
            rarest = self.tables.rarest_line(new.literal, meta.number, LITERAL_SCAN_CAP + 1)
            if rarest is None or rarest[1] > LITERAL_SCAN_CAP:
                return {}
            prs = self.tables.prs_with_line(rarest[0], meta.number)
        else:
            prs = sorted(shared, key=lambda n: (-len(shared[n]), n))[:LITERAL_REPORT_TOP]
        out = {}
        for pr in prs:
            n = self.tables.lines_shared(new.literal, pr)
            if n:
                out[pr] = n
        return out

    def _postings(
        self, fingerprints: Iterable[int], boilerplate_max_prs: int | None, exclude: int | None
    ) -> list[tuple[int, int]]:
        """(fingerprint, PR) rows, skipping fingerprints held by more than boilerplate_max_prs other PRs."""
        fps = list(fingerprints)
        if boilerplate_max_prs is not None:
            df = self.document_frequency(fps, boilerplate_max_prs + 1, exclude)
            fps = [h for h in fps if df[h] <= boilerplate_max_prs]
        return self.tables.postings(fps, exclude)

    def _metas(self, numbers: Iterable[int]) -> dict[int, PrMeta]:
        rows = self.tables.prs(numbers)
        return {
            n: PrMeta(r.number, r.author, r.created_at, r.merged_at, r.closed_at) for n, r in rows.items()
        }


def check(
    index: CopycatIndex, pr: PullRequest, rules: Rules, prior_warnings: int = 0
) -> tuple[CopycatFinding, PrPrint]:
    """Check a PR against the index (read only); returns the finding and the prints to ``add`` afterwards."""
    cfg = rules.copycat
    new, meta = fingerprint_pr(pr, cfg.winnowing.k, cfg.winnowing.w), PrMeta.of(pr)
    evidence = index.evidence(new, meta, cfg.boilerplate_max_prs, cfg.tiny_pr.below_added_lines)
    return assess(new, meta, evidence, rules, prior_warnings), new
