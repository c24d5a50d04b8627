"""The dashboard's data: pure functions from store rows and ledger files to what the pages show (the
frontier of main, PR summaries, the verdict history, the per-context forest, the A/A noise of the runner
pool, the ledgers). No I/O but reading the ledger folder; bounded in rows, so no page grows with the store.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from evalbot import ledgers, times
from evalbot.model import ContextEstimate
from evalbot.store import Calibration, EvaluationRecord, LedgerEntry, TrackCredit

PER_PAGE = 200  # rows per page of a long list
MAX_PR_EVALUATIONS = 100  # evaluations listed on a PR's own page, newest first
MAX_PLOT_POINTS = 300  # per plotted series; more are merged into equal-count chunks
MAX_SERIES = 10  # lines per plot; the rest are listed as left out
MAX_REASONS = 6
MAX_FOREST_ROWS = 40
PAGE_LIMIT_BYTES = 1_000_000
MANIFEST = ".evalbot-dashboard"  # what the last build wrote, so a rebuild removes only its own files

STATUSES = ("PASS", "REJECT", "INFRA_ERROR", "INCONCLUSIVE", "SKIPPED", "GAVE_UP")
STATUS_COLORS = {
    "PASS": "#2e7d32",
    "REJECT": "#c62828",
    "INFRA_ERROR": "#ef6c00",
    "INCONCLUSIVE": "#f9a825",
    "SKIPPED": "#78909c",
    "GAVE_UP": "#6a1b9a",
}
PALETTE = ("#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457", "#5d4037",
            "#558b2f", "#37474f")  # fmt: skip


# ---------------------------------------------------------------- time


def parse_time(text: str | None) -> datetime | None:
    """An ISO 8601 time from the store or a ledger as an aware UTC datetime; None if absent or unreadable."""
    if not text:
        return None
    try:
        return times.parse(text.strip(), naive_is_utc=True)
    except ValueError:
        return None


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# ---------------------------------------------------------------- the frontier


@dataclass(frozen=True)
class FrontierPoint:
    """Main at one commit: its median throughput over every evaluation measured against it."""

    at: datetime  # when it was first measured
    value: float
    base_sha: str
    n: int  # evaluations (or, after downsampling, main commits) behind the point


@dataclass(frozen=True)
class FrontierSeries:
    """Main's throughput at one (model, metric, context) over time, oldest first."""

    model: str
    metric: str
    context: int
    points: tuple[FrontierPoint, ...]

    @property
    def latest(self) -> FrontierPoint:
        return self.points[-1]

    @property
    def best(self) -> FrontierPoint:
        return max(self.points, key=lambda p: p.value)


@dataclass(frozen=True)
class MergeMark:
    """A merge from the store's ledger: the PR that moved main, and its recorded gain."""

    pr: int
    sha: str
    author: str
    gain: float | None
    at: datetime
    tracks: tuple[tuple[str, float | None], ...] = ()  # the tracks whose round it led, with each one's gain


def frontier(evaluations: Iterable[EvaluationRecord]) -> list[FrontierSeries]:
    """Main's median throughput per (model, metric, context) and main commit, from every finished evaluation.

    Each evaluation measured main (its base) beside the PR; all of them against one main commit are
    pooled into that commit's median, placed at the first time it was measured.
    """
    pooled: dict[tuple[str, str, int], dict[str, list[tuple[datetime, float]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for rec in evaluations:
        at = parse_time(rec.finished_at)
        if rec.state != "done" or rec.verdict is None or at is None:
            continue
        for e in rec.verdict.estimates:
            if _finite(e.base_median) and e.base_median > 0:
                pooled[(e.model, e.metric, e.context)][rec.key.base_sha].append((at, e.base_median))
    out = []
    for (model, metric, context), by_sha in pooled.items():
        points = sorted(
            (
                FrontierPoint(min(t for t, _ in seen), statistics.median(v for _, v in seen), sha, len(seen))
                for sha, seen in by_sha.items()
            ),
            key=lambda p: (p.at, p.base_sha),
        )
        out.append(FrontierSeries(model, metric, context, tuple(points)))
    return sorted(out, key=lambda s: (s.model, s.metric != "decode_tps", s.metric, s.context))


def merges(entries: Iterable[LedgerEntry], credits: Iterable[TrackCredit] = ()) -> list[MergeMark]:
    """The store ledger's merges, oldest first (credits are not merges), each with the tracks it was
    credited in."""
    led: dict[tuple[int, str], list[tuple[str, float | None]]] = defaultdict(list)
    for c in credits:
        led[(c.pr, c.sha)].append((c.track, c.gain if _finite(c.gain) else None))
    out = []
    for e in entries:
        at = parse_time(e.at)
        if e.kind == "merge" and at is not None:
            gain = e.gain if _finite(e.gain) else None
            out.append(MergeMark(e.pr, e.sha, e.author, gain, at, tuple(led.get((e.pr, e.sha), ()))))
    return sorted(out, key=lambda m: (m.at, m.pr))


def track_tally(marks: Iterable[MergeMark]) -> list[tuple[str, int, tuple[str, ...]]]:
    """Per track: how many merges it credited, and to whom (first credited first)."""
    tally: dict[str, list[str]] = defaultdict(list)
    for mk in marks:
        for track, _ in mk.tracks:
            tally[track].append(mk.author)
    return [(track, len(who), tuple(dict.fromkeys(who))) for track, who in tally.items()]


T = TypeVar("T")


def chunks(points: Sequence[T], limit: int) -> list[Sequence[T]]:
    """``points`` (more than ``limit``) as ``limit`` runs of consecutive points, of equal count: what a plot
    shows each as one point."""
    n = len(points)
    return [points[i * n // limit : (i + 1) * n // limit] for i in range(limit)]


def downsample(points: Sequence[FrontierPoint], limit: int = MAX_PLOT_POINTS) -> list[FrontierPoint]:
    """At most ``limit`` points: consecutive equal-count chunks, each merged into its median time and value."""
    if len(points) <= limit:
        return list(points)
    return [
        FrontierPoint(c[len(c) // 2].at, statistics.median(p.value for p in c), c[len(c) // 2].base_sha,
                      sum(p.n for p in c))
        for c in chunks(points, limit)
    ]  # fmt: skip


# ---------------------------------------------------------------- PRs and their verdicts


def headline(rec: EvaluationRecord) -> ContextEstimate | None:
    """The estimate a verdict is summed up by (the scored context, or the worst regression of a REJECT)."""
    return rec.verdict.headline if rec.verdict is not None else None


def outcome(rec: EvaluationRecord) -> str | None:
    """An evaluation's outcome: its verdict's status, GAVE_UP, or None while it has none."""
    if rec.state == "gave_up":
        return "GAVE_UP"
    # a re-queued evaluation keeps its last verdict until the new run replaces it
    return rec.status.value if rec.status is not None else None


@dataclass(frozen=True)
class PrSummary:
    """Everything the site shows about one PR, from its evaluations (newest first)."""

    pr: int
    title: str
    author: str
    branch: str
    repo: str
    evaluations: tuple[EvaluationRecord, ...]
    latest: EvaluationRecord | None  # the newest evaluation with a verdict
    last_at: str  # the newest time any of its evaluations moved

    @property
    def outcomes(self) -> Counter[str]:
        return Counter(o for r in self.evaluations if (o := outcome(r)))


def _moved_at(rec: EvaluationRecord) -> str:
    return rec.finished_at or rec.started_at or rec.queued_at


def pr_summaries(evaluations: Iterable[EvaluationRecord]) -> list[PrSummary]:
    """One summary per PR, highest PR number first."""
    by_pr: dict[int, list[EvaluationRecord]] = defaultdict(list)
    for rec in evaluations:
        by_pr[rec.key.pr].append(rec)
    out = []
    for pr, recs in by_pr.items():
        recs.sort(key=lambda r: (_moved_at(r), r.queued_at), reverse=True)
        prov = next((r.measurements.provenance for r in recs if r.measurements is not None), None)
        out.append(
            PrSummary(
                pr=pr,
                title=prov.title if prov else "",
                author=prov.author if prov else "",
                branch=prov.branch if prov else "",
                repo=prov.repo if prov else "",
                evaluations=tuple(recs),
                latest=next((r for r in recs if r.verdict is not None), None),
                last_at=_moved_at(recs[0]),
            )
        )
    return sorted(out, key=lambda s: s.pr, reverse=True)


@dataclass(frozen=True)
class VerdictHistory:
    """Evaluation outcomes counted per period (a day, a week or a month, whichever keeps the bars few)."""

    unit: str
    starts: tuple[datetime, ...]
    counts: dict[str, tuple[int, ...]]  # status -> count per period

    @property
    def total(self) -> int:
        return sum(sum(c) for c in self.counts.values())


def _period_start(moment: datetime, unit: str) -> datetime:
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if unit == "day":
        return day
    if unit == "week":
        return day - timedelta(days=day.weekday())
    return day.replace(day=1)


def next_period(start: datetime, unit: str) -> datetime:
    if unit == "day":
        return start + timedelta(days=1)
    if unit == "week":
        return start + timedelta(weeks=1)
    return (start + timedelta(days=32)).replace(day=1)


def verdict_history(evaluations: Iterable[EvaluationRecord], max_bars: int = 80) -> VerdictHistory:
    """How many evaluations ended in each outcome, per period, over the store's whole history."""
    ended = [(at, o) for r in evaluations if (o := outcome(r)) and (at := parse_time(r.finished_at))]
    if not ended:
        return VerdictHistory("day", (), {s: () for s in STATUSES})
    first, last = min(a for a, _ in ended), max(a for a, _ in ended)
    span_days = (last - first).days + 1
    unit = "day" if span_days <= max_bars else "week" if span_days <= 7 * max_bars else "month"
    starts = [_period_start(first, unit)]
    while next_period(starts[-1], unit) <= last:
        starts.append(next_period(starts[-1], unit))
    index = {s: i for i, s in enumerate(starts)}
    counts = {s: [0] * len(starts) for s in STATUSES}
    for at, o in ended:
        counts[o][index[_period_start(at, unit)]] += 1
    return VerdictHistory(unit, tuple(starts), {s: tuple(c) for s, c in counts.items()})


# ---------------------------------------------------------------- the per-context forest (inline SVG)


@dataclass(frozen=True)
class ForestRow:
    label: str
    y: float
    x: float
    x_lo: float
    x_hi: float
    kind: str  # gain, regression or even
    text: str  # the ratio's change and its CI, e.g. "+3.1% [+1.2%, +5.0%]"
    clipped: bool


@dataclass(frozen=True)
class Forest:
    """Geometry of a per-context results plot: one CI bar per estimate, against main (ratio 1)."""

    width: int
    height: int
    left: float  # where the plot area starts (labels are to its left)
    right_edge: float  # where it ends (the change and its CI are written to its right)
    x_one: float
    top: float
    bottom: float
    ticks: tuple[tuple[float, str], ...]
    rows: tuple[ForestRow, ...]


def signed_pct(fraction: float, digits: int) -> str:
    text = f"{fraction * 100:+.{digits}f}%"
    return text[1:] if text.strip("+-0.%") == "" else text


def forest(estimates: Sequence[ContextEstimate], width: int = 720) -> Forest | None:
    """The plot geometry for a verdict's per-context estimates; None when none is finite."""
    usable = [e for e in estimates if all(_finite(v) for v in (e.ratio, e.ci_low, e.ci_high))][
        :MAX_FOREST_ROWS
    ]
    if not usable:
        return None
    left, right, row_h, top = 250.0, 180.0, 24.0, 26.0
    lo = max(min(1.0, *(e.ci_low for e in usable)), 0.5)
    hi = min(max(1.0, *(e.ci_high for e in usable)), 2.0)
    pad = max((hi - lo) * 0.1, 0.005)
    lo, hi = lo - pad, hi + pad
    span = width - left - right

    def px(ratio: float) -> float:
        return round(left + (min(max(ratio, lo), hi) - lo) / (hi - lo) * span, 1)

    step = next((s for s in (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5) if (hi - lo) / s <= 6), 1.0)
    digits = 1 if step < 0.01 else 0
    first = math.ceil(round(lo / step, 6)) * step
    ticks = []
    tick = first
    while tick <= hi + 1e-12:
        ticks.append((px(tick), signed_pct(tick - 1.0, digits)))
        tick = round(tick + step, 9)
    rows = []
    for i, e in enumerate(usable):
        kind = "regression" if e.regression else "gain" if e.ci_low > 1.0 else "even"
        d = 2 if all(abs(v - 1.0) < 0.0095 for v in (e.ratio, e.ci_low, e.ci_high)) else 1
        text = f"{signed_pct(e.ratio - 1, d)} [{signed_pct(e.ci_low - 1, d)}, {signed_pct(e.ci_high - 1, d)}]"
        label = f"{clip_text(e.model, 26)} · {e.context} · {METRICS.get(e.metric, clip_text(e.metric, 10))}"
        rows.append(
            ForestRow(
                label,
                top + row_h * (i + 0.5),
                px(e.ratio),
                px(e.ci_low),
                px(e.ci_high),
                kind,
                text,
                clipped=e.ci_low < lo or e.ci_high > hi,
            )
        )
    bottom = top + row_h * len(rows)
    return Forest(
        width, int(bottom + 34), left, width - right, px(1.0), top, bottom, tuple(ticks), tuple(rows)
    )


METRICS = {"decode_tps": "decode", "prefill_tps": "prefill"}


def clip_text(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------------------------------------------------------------- the A/A noise of the runner pool


@dataclass(frozen=True)
class NoisePoint:
    """One calibration of one box: the median over the (model, context) rows it measured."""

    at: datetime
    noise_cv: float
    mde: float
    false_positive_rate: float
    rows: int


@dataclass(frozen=True)
class NoiseSeries:
    """One box's A/A calibrations under one profile, oldest first."""

    profile: str
    box: str
    points: tuple[NoisePoint, ...]


def noise(calibrations: Iterable[Calibration]) -> list[NoiseSeries]:
    """Calibrations (``store.calibrations.recorded()``) as one series per (profile, box).

    A calibration writes one row per (model, context) at one time; a point is their median, so a box that
    turned noisy stands out from the rest of the pool.
    """
    grouped: dict[tuple[str, str], dict[datetime, list[Calibration]]] = defaultdict(lambda: defaultdict(list))
    for c in calibrations:
        at = parse_time(c.at)
        if at is None or not all(_finite(v) for v in (c.noise_cv, c.mde, c.false_positive_rate)):
            continue
        grouped[(str(c.profile), str(c.box))][at].append(c)
    out = []
    for (profile, box), by_time in sorted(grouped.items()):
        points = tuple(
            NoisePoint(
                at,
                statistics.median(float(c.noise_cv) for c in rows),
                statistics.median(float(c.mde) for c in rows),
                statistics.median(float(c.false_positive_rate) for c in rows),
                len(rows),
            )
            for at, rows in sorted(by_time.items())
        )
        out.append(NoiseSeries(profile, box, points))
    return out


def latest_calibrations(calibrations: Iterable[Calibration]) -> list[Calibration]:
    """The newest calibration per (box, profile, model, context)."""
    newest: dict[tuple[str, str, str, int], Calibration] = {}
    for c in calibrations:
        key = (str(c.box), str(c.profile), str(c.model), int(c.context))
        if key not in newest or (parse_time(c.at) or datetime.min.replace(tzinfo=UTC)) > (
            parse_time(newest[key].at) or datetime.min.replace(tzinfo=UTC)
        ):
            newest[key] = c
    return [newest[k] for k in sorted(newest)]


def side_bias_note(details: object) -> str:
    """A calibration's side bias for the noise page (`calibrate.side_bias`, in its stored details): the side
    equal code reads faster and by how much where its runs agree on one, "none" where they do not, "—" where
    it was not computed (fewer than 3 runs, or a row from before it) or the stored figures are not numbers."""
    bias = details.get("side_bias") if isinstance(details, dict) else None
    if not isinstance(bias, dict):
        return "—"
    figures = [_number(bias.get(k)) for k in ("change", "t", "runs")]
    if any(v is None for v in figures):
        return "—"
    change, t, runs = (float(v or 0.0) for v in figures)
    if bias.get("agreed") is not True:
        return "none"
    who = "main" if change < 0 else "PR"
    return f"{who} {abs(change):.2%} faster (t {t:+.1f}, {int(runs)} runs)"


def _number(value: object) -> float | None:
    """A stored figure as a finite float, or None (a string, a bool, NaN, missing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
        return None
    return float(value)


# ---------------------------------------------------------------- the ledgers


@dataclass(frozen=True)
class LedgerFiles:
    """The texts of FLAGGED.md and blocked-contributors.txt, and where they came from (None: not given)."""

    flagged: str | None = None
    blocked: str | None = None
    source: str = ""


@dataclass(frozen=True)
class LedgerView:
    """The parsed ledgers, or why a file could not be read (a hand edit that broke it)."""

    source: str
    flags: tuple[ledgers.FlagEntry, ...] = ()
    blocked: tuple[ledgers.BlockedEntry, ...] = ()
    errors: tuple[str, ...] = ()
    given: bool = False


def read_ledger_dir(root: Path) -> LedgerFiles:
    """The ledgers from a checkout (its ``.github/``); a missing file reads as empty."""

    def text(rel: str) -> str:
        path = root / rel
        return path.read_text(encoding="utf-8") if path.is_file() else ""

    return LedgerFiles(text(ledgers.FLAGGED_PATH), text(ledgers.BLOCKED_PATH), str(root))


def ledger_view(files: LedgerFiles) -> LedgerView:
    """Parse the ledger files, keeping a parse error as a message instead of failing the whole site."""
    if files.flagged is None and files.blocked is None:
        return LedgerView(source="")
    flags: list[ledgers.FlagEntry] = []
    blocked: list[ledgers.BlockedEntry] = []
    errors = []
    try:
        flags = ledgers.parse_flagged(files.flagged or "")
    except ledgers.LedgerError as exc:
        errors.append(str(exc))
    try:
        blocked = ledgers.parse_blocked(files.blocked or "", errors.append)
    except ledgers.LedgerError as exc:
        errors.append(str(exc))
    flags.sort(key=lambda e: (e.date, e.pr), reverse=True)
    return LedgerView(files.source, tuple(flags), tuple(blocked), tuple(errors), given=True)


@dataclass(frozen=True)
class BlockedRow:
    """One blocked login, as the ledger file and the store each have it."""

    login: str
    file_reason: str | None  # None: not in blocked-contributors.txt
    store_event: Any | None  # the store's BlockEvent, None: not blocked in the store


def blocked_rows(view: LedgerView, store_blocks: Iterable[Any]) -> list[BlockedRow]:
    """Blocked logins from the ledger file and the store's blocklist, side by side, sorted by login."""
    rows: dict[str, BlockedRow] = {}
    for e in view.blocked:
        rows[e.login.lower()] = BlockedRow(e.login, e.reason, None)
    for b in store_blocks:
        prior = rows.get(b.login.lower())
        rows[b.login.lower()] = BlockedRow(
            prior.login if prior else b.login, prior.file_reason if prior else None, b
        )
    return [rows[k] for k in sorted(rows)]
