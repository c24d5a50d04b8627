"""The copycat screen the poller runs before queueing an evaluation: index, check, band, strikes.

The decisions are the pure ones of `containment` and `strikes`; this module only gathers what they
need (the index in the store's file, main's k-grams from the mirror, the author's strikes) and turns
a finding into a `model.Decision` for the poller to apply. A maintainer's `clear` of a PR exempts it from the screen.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from evalbot import git, times
from evalbot.copycat import strikes as copycat_strikes
from evalbot.copycat.containment import Band, PrMeta
from evalbot.copycat.fingerprint import fingerprint_source
from evalbot.copycat.index import CopycatIndex, check
from evalbot.model import Decision, Notice, PullRequest
from evalbot.rules import LabelFamily, Rules
from evalbot.store import Store

CODE_SUFFIXES = (".py", ".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp", ".rs", ".go", ".js", ".ts")
_STRIKE = "copycat:"
_WARN = "copycat-warn:"
_STOPPED = "stopped by the copycat screen"


def main_kgrams(mirror: Path, sha: str, k: int) -> frozenset[int]:
    """Every k-gram of main's code files at `sha` (base code: copying main is not copying a PR)."""
    # -z and surrogateescape: a file name that is not UTF-8 is still a name, never a crash of every poll
    listed = git.run(mirror, "ls-tree", "-r", "-z", "--name-only", sha, timeout=120, text=False)
    if listed.returncode != 0:
        raise git.GitError(
            f"git ls-tree {sha} failed in {mirror}: {listed.stderr.decode(errors='replace')[-300:]}"
        )
    listing = listed.stdout
    names = [n for n in listing.decode("utf-8", errors="surrogateescape").split("\0") if n]
    out: set[int] = set()
    for name in names:
        if not name.endswith(CODE_SUFFIXES):
            continue
        # subprocess encodes the name back to its bytes (os.fsencode), surrogates included
        shown = git.run(mirror, "show", f"{sha}:{name}", timeout=120, text=False)
        if shown.returncode == 0 and len(shown.stdout) < 2_000_000:
            out |= fingerprint_source(name, shown.stdout.decode("utf-8", errors="replace"), k)
    return frozenset(out)


class CopycatScreen:
    """Callable as the poller's `screen`: PR -> Decision (its earlier PRs are in the index)."""

    def __init__(
        self, store: Store, rules: Rules, mirror: Path, *, now: Callable[[], datetime] | None = None
    ):
        self.store, self.rules, self.mirror = store, rules, mirror
        self.now = now or times.now
        self.index = CopycatIndex(store.copycat)
        self._main_sha: str | None = store.meta("copycat_main_sha")

    def set_main(self, sha: str) -> None:
        """Refresh main's k-grams when main moved (cheap when it did not)."""
        if sha == self._main_sha:
            return
        kgrams = main_kgrams(self.mirror, sha, self.rules.copycat.winnowing.k)
        self.index.set_main(kgrams, times.stamp(self.now()))
        self.store.set_meta("copycat_main_sha", sha)
        self._main_sha = sha

    def mark_merged(self, pr: int, at: str) -> None:
        """A merged PR's code is base code for every PR opened after it."""
        self.index.mark_merged(pr, at)

    def _times(self, author: str, prefix: str) -> list[datetime]:
        return [
            times.parse(s.at) for s in self.store.moderation.strikes(author) if s.reason.startswith(prefix)
        ]

    def __call__(self, pr: PullRequest) -> Decision | None:
        lab, now = self.rules.labels, self.now()
        owned = tuple(sorted(self.rules.owned(LabelFamily.SCREEN)))
        if self.store.moderation.cleared(pr.number, pr.head_sha):
            return Decision((), owned)  # a maintainer looked at this head and cleared it
        frozen = copycat_strikes.standing(self._times(pr.author, _STRIKE), now, self.rules.copycat)
        if frozen.frozen(now):
            until = frozen.frozen_until.strftime("%Y-%m-%d") if frozen.frozen_until else "?"
            line = f"{pr.author}'s evaluations are frozen until {until} after {frozen.strikes_in_window} copycat strikes"
            return Decision((), owned, False, Notice("screen", "screened", (line,)), note=_STOPPED)
        warnings = copycat_strikes.prior_warnings(self._times(pr.author, _WARN), now, self.rules.copycat)
        finding, prints = check(self.index, pr, self.rules, warnings)
        self.index.add(PrMeta.of(pr), prints)
        if finding.band is Band.CLEAN:
            return Decision((), owned)
        per_file = ", ".join(f"{f.path} {f.containment:.0%}" for f in finding.per_file if f.shared)
        if finding.score >= self.rules.copycat.containment.warn:
            head = (f"{finding.score:.0%} of this PR's own code fingerprints are in #{finding.original} (opened "
                    f"earlier by someone else){'; per file: ' + per_file if per_file else ''}.")  # fmt: skip
        else:  # a tiny PR's literal overlap: the lines say it; a 0% fingerprint score would only confuse
            head = f"{finding.literal_overlap:.0%} of this PR's added code lines appear verbatim in #{finding.original}."
        lines = (head, *finding.reasons)
        # a flag on this head: an earlier head's clearance (copycat-cleared) no longer describes the PR
        flagged = tuple(sorted({*owned, lab.copycat_cleared}))
        if finding.band is Band.COPYCAT:
            self._strike(pr, f"{_STRIKE} {finding.score:.0%} of #{finding.original}", finding.strike)
            return Decision(
                (lab.copycat,),
                flagged,
                False,
                Notice("screen", lab.copycat, lines),
                close=lab.copycat if finding.close else None,
                flag=lab.copycat,
                note=_STOPPED,
            )
        if finding.counts_as_warning:
            self._strike(pr, f"{_WARN} {finding.score:.0%} of #{finding.original}", True)
        return Decision(
            (lab.copycat_warn,),
            flagged,
            False,
            Notice("screen", lab.copycat_warn, lines),
            flag=lab.copycat_warn,
            note=_STOPPED,
        )

    def _strike(self, pr: PullRequest, reason: str, record: bool) -> None:
        if not record:
            return
        self.store.moderation.add_strike(pr.author, pr.number, reason)
        standing = copycat_strikes.standing(self._times(pr.author, _STRIKE), self.now(), self.rules.copycat)
        if standing.blocklisted:
            self.store.moderation.block(pr.author, f"{standing.strikes_in_window} copycat strikes", "evalbot")
