"""Copycat decisions: who could have been copied, how much of a PR they hold, and the band from rules.

A PR's own fingerprints are its winnowed fingerprints (``fingerprint``) less base code:
those on main when it was opened, those seen in more than ``boilerplate_max_prs`` other PRs, and
those of PRs merged before it was opened. Its score against an earlier PR is the share of its own
fingerprints that PR also has (containment), overall and per file; the original is the eligible PR
with the highest score. Everything here is pure: ``index`` gathers the same ``Evidence``
from SQLite, ``gather`` from PRs in memory.

Times are taken as of the newer PR's creation, so a re-check later gives the same answer: a PR that
copied an open PR stays a copy after that PR merges (a re-application of an already merged change).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from evalbot import times
from evalbot.copycat.fingerprint import PrPrint, fingerprint_pr
from evalbot.model import PullRequest
from evalbot.rules import Copycat, Rules

# This repository's engine/ and kernels/ average 9.7 normalized tokens per code line (measured). A PR
# counts as at least tokens / 10 lines, so a copy joined into a few long lines does not become tiny.
TOKENS_PER_LINE = 10


class Band(enum.StrEnum):
    """The copycat outcome for one PR."""

    CLEAN = "clean"
    WARN = "copycat-warn"
    COPYCAT = "copycat"


@dataclass(frozen=True)
class PrMeta:
    """The facts about a PR that eligibility needs; times are canonical UTC ISO 8601 strings."""

    number: int
    author: str
    created_at: str
    merged_at: str | None = None
    closed_at: str | None = None

    @classmethod
    def of(cls, pr: PullRequest) -> PrMeta:
        """The meta of a PR from intake."""
        # intake may not know the merge time of an old PR: its close (or last update) is the best bound
        merged_at = pr.merged_at or (pr.closed_at or pr.updated_at if pr.merged else None)
        return cls(
            pr.number,
            pr.author,
            utc(pr.created_at),
            utc(merged_at) if merged_at else None,
            utc(pr.closed_at) if pr.closed_at else None,
        )


@dataclass(frozen=True)
class Evidence:
    """What is known about a new PR's fingerprints: base code among them and who else has them.

    Exclusions take precedence in field order: a fingerprint on main is not also boilerplate, and
    a boilerplate one is not also merged.
    """

    main: frozenset[int]  # on main when the new PR was opened
    boilerplate: frozenset[int]  # in more than boilerplate_max_prs other PRs
    merged: frozenset[int]  # in PRs merged before the new PR was opened
    shared: Mapping[int, frozenset[int]]  # other PR -> the new PR's non-boilerplate fingerprints it has
    literal: Mapping[int, int]  # other PR -> how many of the new PR's literal lines it adds
    others: Mapping[int, PrMeta]  # every PR named above


@dataclass(frozen=True)
class FileScore:
    """Containment of one file's own fingerprints in the original."""

    path: str
    fingerprints: int
    shared: int
    containment: float


@dataclass(frozen=True)
class Banding:
    """A band and what follows from it (close, strike, skip): the copycat core's own, not a model.Decision."""

    band: Band
    close: bool = False
    strike: bool = False
    skip_evaluation: bool = False
    counts_as_warning: bool = False  # toward warnings_to_block; a tiny PR's literal warning does not
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class CopycatFinding:
    """The copycat check of one PR: band, score against the original, per-file scores, reasons."""

    band: Band
    label: str | None  # the label to set (rules' labels), None when clean
    original: int | None  # the PR it copies; None when clean
    score: float  # containment of its own fingerprints in the best eligible earlier PR
    per_file: tuple[FileScore, ...]
    literal_overlap: float  # share of its code lines found verbatim in the original
    code_lines: int  # size_in_lines
    own_lines: int  # own_size: what is left after the exclusions, in lines
    fingerprints: int  # own fingerprints compared
    excluded_main: int
    excluded_boilerplate: int
    excluded_merged: int
    close: bool = False
    strike: bool = False
    skip_evaluation: bool = False
    counts_as_warning: bool = False
    reasons: tuple[str, ...] = ()


def utc(stamp: str) -> str:
    """An ISO 8601 time in the one text form (evalbot.times); a time without a zone is taken as UTC."""
    return times.stamp(times.parse(stamp, naive_is_utc=True))


def before(a: str, b: str) -> bool:
    """Whether time a is earlier than time b, compared as times (never as text)."""
    return times.parse(utc(a)) < times.parse(utc(b))


def merged_before(old: PrMeta, new: PrMeta) -> bool:
    """Whether old was merged before new was opened (its code was base code for new)."""
    return old.merged_at is not None and not before(new.created_at, old.merged_at)


def may_copy_from(new: PrMeta, old: PrMeta) -> bool:
    """Whether new could have copied old: opened earlier, by someone else, unmerged when new was opened."""
    return (
        old.number != new.number
        and before(old.created_at, new.created_at)
        and old.author.casefold() != new.author.casefold()
        and not merged_before(old, new)
    )


def decide(
    code_lines: int,
    own_lines: int,
    score: float,
    literal_overlap: float,
    rules: Copycat,
    prior_warnings: int = 0,
) -> Banding:
    """The band for a PR of this size (and own size after exclusions), best containment and overlap."""
    tiny = rules.tiny_pr.below_added_lines
    if code_lines < tiny:
        if literal_overlap >= rules.tiny_pr.warn_literal_overlap:
            why = (
                f"{code_lines} added code lines (< {tiny}) with {literal_overlap:.0%} literal overlap: "
                "a maintainer decides (independent small fixes converge)"
            )
            return Banding(Band.WARN, reasons=(why,))
        return Banding(
            Band.CLEAN, reasons=(f"{code_lines} added code lines (< {tiny}): never blocked automatically",)
        )
    if own_lines < tiny:
        # after main, boilerplate and merged code are removed, the PR's own part is as small as a tiny PR
        why = f"about {own_lines} added code lines of its own (< {tiny}) after exclusions: never blocked"
        return Banding(Band.CLEAN, reasons=(why,))
    block, warn = rules.containment.block, rules.containment.warn
    if score >= block:
        why = f"containment {score:.0%} >= {block:.0%}"
        return Banding(Band.COPYCAT, close=True, strike=True, skip_evaluation=True, reasons=(why,))
    if score >= warn:
        why = f"containment {score:.0%} in [{warn:.0%}, {block:.0%})"
        if prior_warnings + 1 >= rules.warnings_to_block:
            more = f"warning {prior_warnings + 1} of {rules.warnings_to_block}: blocked like a copy"
            return Banding(Band.COPYCAT, close=True, strike=True, skip_evaluation=True, reasons=(why, more))
        return Banding(Band.WARN, skip_evaluation=True, counts_as_warning=True, reasons=(why,))
    return Banding(Band.CLEAN, reasons=(f"containment {score:.0%} < {warn:.0%}",))


def size_in_lines(new: PrPrint) -> int:
    """Added code lines, but never fewer than tokens / TOKENS_PER_LINE."""
    return max(new.code_lines, -(-new.tokens // TOKENS_PER_LINE))


def own_size(new: PrPrint, own: frozenset[int]) -> int:
    """The PR's size in lines scaled by the share of its fingerprints that are its own."""
    return round(size_in_lines(new) * len(own) / len(new.hashes)) if new.hashes else 0


def per_file(new: PrPrint, own: frozenset[int], shared: frozenset[int]) -> tuple[FileScore, ...]:
    """Containment of each file's own fingerprints in those shared with the original."""
    out = []
    for f in new.files:
        mine = f.hashes & own
        hit = len(mine & shared)
        out.append(FileScore(f.path, len(mine), hit, hit / len(mine) if mine else 0.0))
    return tuple(out)


def credited(meta: PrMeta, evidence: Evidence, original: int) -> frozenset[int]:
    """Fingerprints shared with a PR, less those the new PR's author had published before that PR."""
    when = evidence.others[original].created_at
    prior = [
        evidence.shared.get(n, frozenset())
        for n, m in evidence.others.items()
        if n != meta.number and m.author.casefold() == meta.author.casefold() and before(m.created_at, when)
    ]
    return evidence.shared.get(original, frozenset()) - frozenset().union(*prior)


def assess(
    new: PrPrint, meta: PrMeta, evidence: Evidence, rules: Rules, prior_warnings: int = 0
) -> CopycatFinding:
    """The finding for a new PR from its fingerprints and what is known about them."""
    boilerplate = evidence.boilerplate - evidence.main
    merged = evidence.merged - evidence.main - boilerplate
    own = new.hashes - evidence.main - boilerplate - merged
    eligible = sorted(n for n, m in evidence.others.items() if may_copy_from(meta, m))
    best: int | None = None
    score = 0.0
    best_shared: frozenset[int] = frozenset()
    for n in eligible:
        shared = credited(meta, evidence, n) & own
        if own and len(shared) / len(own) > score:
            best, score, best_shared = n, len(shared) / len(own), shared
    lines = size_in_lines(new)
    if lines < rules.copycat.tiny_pr.below_added_lines:
        # a tiny PR is judged by literal overlap: with whoever shares the most of its lines
        original = max(eligible, key=lambda n: (evidence.literal.get(n, 0), -n), default=None)
    else:
        original = best
    overlap = evidence.literal.get(original, 0) / len(new.literal) if original and new.literal else 0.0
    decision = decide(lines, own_size(new, own), score, overlap, rules.copycat, prior_warnings)
    flagged = decision.band is not Band.CLEAN
    label = {Band.COPYCAT: rules.labels.copycat, Band.WARN: rules.labels.copycat_warn}.get(decision.band)
    return CopycatFinding(
        band=decision.band,
        label=label,
        original=original if flagged else None,
        score=score,
        per_file=per_file(new, own, best_shared),
        literal_overlap=overlap,
        code_lines=lines,
        own_lines=own_size(new, own),
        fingerprints=len(own),
        excluded_main=len(new.hashes & evidence.main),
        excluded_boilerplate=len(new.hashes & boilerplate),
        excluded_merged=len(new.hashes & merged),
        close=decision.close,
        strike=decision.strike,
        skip_evaluation=decision.skip_evaluation,
        counts_as_warning=decision.counts_as_warning,
        reasons=(*decision.reasons, f"original: #{original}") if flagged and original else decision.reasons,
    )


def gather(
    new: PrPrint,
    meta: PrMeta,
    others: Sequence[tuple[PrMeta, PrPrint]],
    main: frozenset[int],
    boilerplate_max_prs: int,
) -> Evidence:
    """Evidence by scanning PRs in memory (``index`` answers the same from SQLite)."""
    others = [(m, p) for m, p in others if m.number != meta.number]
    counts: dict[int, int] = {}
    for _, p in others:
        for h in new.hashes & p.hashes:
            counts[h] = counts.get(h, 0) + 1
    boilerplate = frozenset(h for h, c in counts.items() if c > boilerplate_max_prs)
    shared = {m.number: (new.hashes & p.hashes) - boilerplate for m, p in others}
    merged = frozenset().union(*(shared[m.number] for m, _ in others if merged_before(m, meta)))
    return Evidence(
        main=new.hashes & main,
        boilerplate=boilerplate,
        merged=merged,
        shared={n: s for n, s in shared.items() if s},
        literal={m.number: len(new.literal & p.literal) for m, p in others if new.literal & p.literal},
        others={m.number: m for m, _ in others},
    )


def check(
    pr: PullRequest,
    others: Sequence[PullRequest],
    main: frozenset[int],
    rules: Rules,
    prior_warnings: int = 0,
) -> CopycatFinding:
    """Check one PR against others in memory; ``main`` holds main's k-grams when the PR was opened."""
    k, w = rules.copycat.winnowing.k, rules.copycat.winnowing.w
    new, meta = fingerprint_pr(pr, k, w), PrMeta.of(pr)
    prints = [(PrMeta.of(o), fingerprint_pr(o, k, w)) for o in others]
    return assess(
        new, meta, gather(new, meta, prints, main, rules.copycat.boilerplate_max_prs), rules, prior_warnings
    )
