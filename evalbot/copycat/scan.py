"""`evalbot copycat scan DIR`: the copycat check over a folder of diffs, offline, for a maintainer who
suspects a ring of copies.

DIR holds unified diffs named ``NNNN-author.diff`` (NNNN is the opening order) and, optionally, a
``base/`` tree standing for main (its code is nobody's to copy). Each PR is checked against every
earlier one, in order, exactly as the bot's screen does (fingerprints, exclusions, bands), then indexed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import unidiff

from evalbot import times
from evalbot.copycat.containment import Band, PrMeta
from evalbot.copycat.fingerprint import fingerprint_source
from evalbot.copycat.index import CopycatIndex, check
from evalbot.model import FileChange, PullRequest
from evalbot.rules import Rules, is_login

_NAME = re.compile(r"(\d{1,9})-(.+)\.diff")
_CODE = (".py", ".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp", ".rs", ".go", ".js", ".ts")
_START = datetime(2026, 1, 1, tzinfo=UTC)


class ScanError(ValueError):
    """The folder cannot be scanned: the message names the file and why."""


@dataclass(frozen=True)
class ScanRow:
    """One PR's outcome: its band, the earlier PR it is most contained in, and how much."""

    number: int
    author: str
    band: str
    original: int | None
    containment: float
    literal_overlap: float
    reasons: tuple[str, ...]


def read_diffs(folder: Path) -> list[tuple[int, str, str]]:
    """(number, author, diff text) of every NNNN-author.diff in folder, in opening order."""
    if not folder.is_dir():
        raise ScanError(f"{folder}: not a folder")
    out = []
    for path in sorted(folder.iterdir()):
        if path.suffix != ".diff":
            continue
        m = _NAME.fullmatch(path.name)
        if m is None or not is_login(m.group(2)):
            raise ScanError(f"{path.name}: expected NNNN-author.diff (a number, a GitHub login)")
        try:
            out.append((int(m.group(1)), m.group(2), path.read_text(encoding="utf-8")))
        except UnicodeDecodeError as exc:
            raise ScanError(f"{path.name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    numbers = [n for n, _, _ in out]
    if len(set(numbers)) != len(numbers):
        raise ScanError(f"{folder}: two diffs share a number")
    return sorted(out)


def pull_of(number: int, author: str, text: str) -> PullRequest:
    """A PullRequest whose files are the diff's (the facts the copycat check reads)."""
    try:
        patches = unidiff.PatchSet(text)
    except unidiff.UnidiffParseError as exc:
        raise ScanError(f"#{number:04d}-{author}.diff: not a unified diff: {exc}") from None
    files = tuple(FileChange(f.path, "added" if f.is_added_file else "modified", f.added, f.removed,
                             "".join(str(h) for h in f)) for f in patches)  # fmt: skip
    opened = times.stamp(_START + timedelta(minutes=number))
    return PullRequest(number=number, author=author, title="", body="", state="open", draft=False, merged=False,
                       head_sha="0" * 40, base_sha="0" * 40, base_ref="main", head_ref=f"pr-{number}",
                       created_at=opened, updated_at=opened, files=files)  # fmt: skip


def base_kgrams(base: Path, k: int) -> frozenset[int]:
    """Every k-gram of the code files under base/ (main)."""
    out: set[int] = set()
    for path in sorted(base.rglob("*")):
        if path.is_file() and path.suffix in _CODE and path.stat().st_size < 2_000_000:
            out |= fingerprint_source(
                str(path.relative_to(base)), path.read_text("utf-8", errors="replace"), k
            )
    return frozenset(out)


def scan(folder: Path, rules: Rules) -> list[ScanRow]:
    """Check every diff of folder against the earlier ones, in order."""
    diffs = read_diffs(folder)
    index = CopycatIndex.in_memory()
    base = folder / "base"
    if base.is_dir():
        index.set_main(base_kgrams(base, rules.copycat.winnowing.k), times.stamp(_START))
    rows = []
    for number, author, text in diffs:
        pr = pull_of(number, author, text)
        finding, prints = check(index, pr, rules)
        index.add(PrMeta.of(pr), prints)
        rows.append(ScanRow(number, author, finding.band.value if finding.band is not Band.CLEAN else "clean",
                            finding.original, round(finding.score, 4), round(finding.literal_overlap, 4),
                            finding.reasons))  # fmt: skip
    return rows
