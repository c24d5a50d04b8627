"""The dashboard: a static site (HTML, one CSS file, SVG plots) built from the store and the ledgers.

Three layers. Pure functions turn store rows into page data (the frontier of main, PR summaries, the
verdict history, the A/A noise of the runner pool). Plot functions draw that data with matplotlib into
SVG text, bounded in points so that no page grows with the number of PRs. ``build_site`` is the only
I/O: it renders every page through ``evalbot.render`` (the one jinja2 user) and writes it under a folder.

Long lists (PRs, flags, strikes, merges) are paginated, a PR's own page keeps its newest evaluations,
and every plot is downsampled: every page stays far below 1 MB however many PRs the store holds.
"""

from __future__ import annotations

import io
import math
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from evalbot import ledgers, render
from evalbot.model import ContextEstimate
from evalbot.store import Calibration, EvaluationRecord, LedgerEntry, Store

PER_PAGE = 200  # rows per page of a long list
MAX_PR_EVALUATIONS = 100  # evaluations listed on a PR's own page, newest first
MAX_PLOT_POINTS = 300  # per plotted series; more are merged into equal-count chunks
MAX_SERIES = 10  # lines per plot; the rest are listed as left out
MAX_REASONS = 6
MAX_FOREST_ROWS = 40
PAGE_LIMIT_BYTES = 1_000_000
MANIFEST = ".evalbot-dashboard"  # what the last build wrote, so a rebuild removes only its own files

STATUSES = ("PASS", "REJECT", "INFRA_ERROR", "INCONCLUSIVE", "SKIPPED", "GAVE_UP")
_STATUS_COLORS = {
    "PASS": "#2e7d32",
    "REJECT": "#c62828",
    "INFRA_ERROR": "#ef6c00",
    "INCONCLUSIVE": "#f9a825",
    "SKIPPED": "#78909c",
    "GAVE_UP": "#6a1b9a",
}
_PALETTE = ("#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457", "#5d4037",
            "#558b2f", "#37474f")  # fmt: skip


# ---------------------------------------------------------------- time


def parse_time(text: str | None) -> datetime | None:
    """An ISO 8601 time from the store or a ledger as an aware UTC datetime; None if absent or unreadable."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


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


def merges(entries: Iterable[LedgerEntry]) -> list[MergeMark]:
    """The store ledger's merges, oldest first (credits are not merges)."""
    out = []
    for e in entries:
        at = parse_time(e.at)
        if e.kind == "merge" and at is not None:
            out.append(MergeMark(e.pr, e.sha, e.author, e.gain if _finite(e.gain) else None, at))
    return sorted(out, key=lambda m: (m.at, m.pr))


def downsample(points: Sequence[FrontierPoint], limit: int = MAX_PLOT_POINTS) -> list[FrontierPoint]:
    """At most ``limit`` points: consecutive equal-count chunks, each merged into its median time and value."""
    if len(points) <= limit:
        return list(points)
    out = []
    for i in range(limit):
        chunk = points[i * len(points) // limit : (i + 1) * len(points) // limit]
        mid = chunk[len(chunk) // 2]
        out.append(FrontierPoint(mid.at, statistics.median(p.value for p in chunk), mid.base_sha,
                                 sum(p.n for p in chunk)))  # fmt: skip
    return out


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


def _next_period(start: datetime, unit: str) -> datetime:
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
    while _next_period(starts[-1], unit) <= last:
        starts.append(_next_period(starts[-1], unit))
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


def _signed_pct(fraction: float, digits: int) -> str:
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
        ticks.append((px(tick), _signed_pct(tick - 1.0, digits)))
        tick = round(tick + step, 9)
    rows = []
    for i, e in enumerate(usable):
        kind = "regression" if e.regression else "gain" if e.ci_low > 1.0 else "even"
        d = 2 if all(abs(v - 1.0) < 0.0095 for v in (e.ratio, e.ci_low, e.ci_high)) else 1
        text = (
            f"{_signed_pct(e.ratio - 1, d)} [{_signed_pct(e.ci_low - 1, d)}, {_signed_pct(e.ci_high - 1, d)}]"
        )
        label = f"{_clip(e.model, 26)} · {e.context} · {_METRICS.get(e.metric, _clip(e.metric, 10))}"
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
            )  # fmt: skip
        )
    bottom = top + row_h * len(rows)
    return Forest(
        width, int(bottom + 34), left, width - right, px(1.0), top, bottom, tuple(ticks), tuple(rows)
    )


_METRICS = {"decode_tps": "decode", "prefill_tps": "prefill"}


def _clip(text: str, limit: int) -> str:
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
    """Calibrations (``Store.calibrations()``) as one series per (profile, box).

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


# ---------------------------------------------------------------- plots (matplotlib, SVG)


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure  # lazily: the bot runs without the dashboard's dependencies

    return Figure(figsize=(width, height), layout="constrained")


def _svg(fig: Any) -> str:
    import matplotlib

    buf = io.StringIO()
    # Text as <text> (not glyph paths) keeps files small; a fixed salt and no date keep them reproducible.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "evalbot-dashboard"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def _time_axis(ax: Any) -> None:
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))


def _style(ax: Any) -> None:
    ax.grid(True, color="#e0e0e0", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def plot_frontier(series: Sequence[FrontierSeries], marks: Sequence[MergeMark], unit: str) -> str:
    """Main's throughput per context over time for one model and metric, with the merges marked below it.

    Every merge is a tick on the time axis; the five with the largest recorded gain are labelled.
    """
    import matplotlib.transforms as mtransforms

    fig = _figure(9, 4.2)
    ax = fig.add_subplot()
    _style(ax)
    shown = list(series)[:MAX_SERIES]
    for i, s in enumerate(shown):
        pts = downsample(s.points)
        ax.plot([p.at for p in pts], [p.value for p in pts], marker="o" if len(pts) <= 80 else "", markersize=2.5,
                linewidth=1.3, drawstyle="steps-post", color=_PALETTE[i % len(_PALETTE)],
                label=f"ctx {s.context}")  # fmt: skip
    if shown:
        first = min(s.points[0].at for s in shown)
        last = max(s.points[-1].at for s in shown)
        inside = [m for m in marks if first - timedelta(days=1) <= m.at <= last + timedelta(days=1)]
        rug = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
        if inside:
            # every merge as one short tick, all in a single path: a thousand merges cost a few kB
            xs = [m.at for m in inside for _ in range(3)]
            ys = [y for _ in inside for y in (0.0, 0.04, math.nan)]  # NaN lifts the pen between ticks
            ax.plot(xs, ys, color="#6d4c41", linewidth=0.8, transform=rug, label=f"merges ({len(inside)})")
        top = sorted((m for m in inside if m.gain is not None), key=lambda m: m.gain or 0.0, reverse=True)[:5]
        for m in top:
            ax.axvline(m.at, color="#6d4c41", linewidth=0.7, linestyle=":", alpha=0.8)
            ax.annotate(f"#{m.pr} {_signed_pct(m.gain or 0.0, 1)}", xy=(m.at, 0.97), xycoords=rug, fontsize=8,
                        rotation=90, ha="right", va="top", color="#4e342e")  # fmt: skip
        _time_axis(ax)
        fig.legend(loc="outside upper left", fontsize=8, ncols=6, frameon=False)
    ax.set_ylabel(f"main, {unit}")
    return _svg(fig)


def plot_verdict_history(history: VerdictHistory) -> str:
    """Stacked bars: how many evaluations ended in each outcome, per period."""
    fig = _figure(9, 3.2)
    ax = fig.add_subplot()
    _style(ax)
    ends = [_next_period(s, history.unit) for s in history.starts]
    widths = [(e - s).total_seconds() / 86400 * 0.85 for s, e in zip(history.starts, ends, strict=True)]
    bottom = [0] * len(history.starts)
    for status in STATUSES:
        counts = history.counts.get(status, ())
        if not any(counts):
            continue
        ax.bar(history.starts, counts, width=widths, bottom=bottom, align="edge", color=_STATUS_COLORS[status],
               label=status.replace("_", " ").lower(), linewidth=0)  # fmt: skip
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    _time_axis(ax)
    ax.set_ylabel(f"evaluations per {history.unit}")
    fig.legend(loc="outside upper left", fontsize=8, ncols=5, frameon=False)
    return _svg(fig)


def plot_noise(series: Sequence[NoiseSeries]) -> str:
    """A/A calibrations over time, one line per box: noise CV, minimum detectable effect, false positives."""
    fig = _figure(9, 6.4)
    axes = fig.subplots(3, 1, sharex=True)
    rows = (("noise CV", lambda p: p.noise_cv * 100), ("MDE", lambda p: p.mde * 100),
            ("false positives", lambda p: p.false_positive_rate * 100))  # fmt: skip
    for ax, (name, value) in zip(axes, rows, strict=True):
        _style(ax)
        for i, s in enumerate(series[:MAX_SERIES]):
            pts = _thin(s.points)
            ax.plot([p.at for p in pts], [value(p) for p in pts], marker="o" if len(pts) <= 80 else "",
                    markersize=2.5, linewidth=1.1, color=_PALETTE[i % len(_PALETTE)],
                    label=_clip(s.box, 30))  # fmt: skip
        ax.set_ylabel(f"{name} (%)")
        ax.set_ylim(bottom=0)
    _time_axis(axes[-1])
    fig.legend(
        *axes[0].get_legend_handles_labels(), loc="outside upper left", fontsize=8, ncols=5, frameon=False
    )
    return _svg(fig)


def _thin(points: Sequence[NoisePoint], limit: int = MAX_PLOT_POINTS) -> list[NoisePoint]:
    """At most ``limit`` points: runs of consecutive calibrations, each shown by its worst values."""
    if len(points) <= limit:
        return list(points)
    out = []
    for i in range(limit):
        run = points[i * len(points) // limit : (i + 1) * len(points) // limit]
        out.append(NoisePoint(run[len(run) // 2].at, max(p.noise_cv for p in run), max(p.mde for p in run),
                              max(p.false_positive_rate for p in run), sum(p.rows for p in run)))  # fmt: skip
    return out


# ---------------------------------------------------------------- pages


@dataclass(frozen=True)
class Pager:
    """Where one page of a long list sits among its siblings."""

    number: int
    count: int
    total_rows: int
    name: str

    def href(self, number: int) -> str:
        return page_name(self.name, number)

    @property
    def numbers(self) -> list[int | None]:
        """Page numbers to link, with None for a gap: first, last, and the neighbourhood of this one."""
        keep = {1, self.count, *range(self.number - 2, self.number + 3)}
        out: list[int | None] = []
        for n in range(1, self.count + 1):
            if n in keep:
                out.append(n)
            elif out and out[-1] is not None:
                out.append(None)
        return out


def page_name(name: str, number: int) -> str:
    """The file of a list's page: prs.html, prs-2.html, ..."""
    return f"{name}.html" if number == 1 else f"{name}-{number}.html"


def paginate(rows: Sequence[Any], name: str, per_page: int) -> Iterator[tuple[Pager, Sequence[Any]]]:
    """A long list cut into pages of ``per_page`` rows; an empty list still has its first page."""
    count = max(1, math.ceil(len(rows) / per_page))
    for number in range(1, count + 1):
        yield Pager(number, count, len(rows), name), rows[(number - 1) * per_page : number * per_page]


@dataclass
class SiteReport:
    """What a build wrote: each page's bytes (HTML plus the plots it shows) and how long it took."""

    out: Path
    pages: dict[str, int] = field(default_factory=dict)
    files: int = 0
    seconds: float = 0.0

    @property
    def largest(self) -> tuple[str, int]:
        return max(self.pages.items(), key=lambda kv: kv[1], default=("", 0))


_PLOT_SRC = re.compile(r'<img [^>]*src="(plots/[A-Za-z0-9_.-]+\.svg)"')


class _Writer:
    """Writes the site's files, keeping the list of them and each page's weight."""

    def __init__(self, out: Path, report: SiteReport) -> None:
        self.out, self.report, self.written = out, report, set()
        self.sizes: dict[str, int] = {}

    def file(self, rel: str, text: str) -> None:
        data = text.encode("utf-8")
        target = self.out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        self.written.add(rel)
        self.sizes[rel] = len(data)

    def page(self, rel: str, template: str, context: dict[str, Any]) -> None:
        html = render.render_site_page(template, context)
        self.file(rel, html)
        plots = sum(self.sizes.get(src, 0) for src in set(_PLOT_SRC.findall(html)))
        self.report.pages[rel] = len(html.encode("utf-8")) + self.sizes["style.css"] + plots


def _slug(*parts: Any) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", "-".join(str(p) for p in parts)).strip("-")[:120] or "plot"


def build_site(
    store: Store,
    out: str | Path,
    *,
    ledger_files: LedgerFiles | None = None,
    per_page: int = PER_PAGE,
    now: datetime | None = None,
    clock: Callable[[], float] | None = None,
) -> SiteReport:
    """Build the whole site under ``out`` from the store and the ledger files; returns what was written.

    A rebuild into the same folder removes the pages the previous build wrote and this one did not; a
    non-empty folder that no build wrote is refused rather than mixed with.
    """
    import time

    tick = clock or time.perf_counter
    started = tick()
    out = Path(out)
    _claim_folder(out)
    report = SiteReport(out)
    w = _Writer(out, report)
    built_at = render.site_time(now or datetime.now(UTC))

    evaluations = store.evaluations()
    summaries = pr_summaries(evaluations)
    series = frontier(evaluations)
    marks = merges(ledger_rows := store.ledger())
    history = verdict_history(evaluations)
    calibrations = store.calibrations()
    view = ledger_view(ledger_files or LedgerFiles())
    strikes = sorted(store.strikes(), key=lambda s: s.at, reverse=True)
    clears = store.clears()
    blocked = blocked_rows(view, store.blocklist())
    pr_numbers = {s.pr for s in summaries}
    states = Counter(r.state for r in evaluations)
    outcomes = Counter(o for r in evaluations if (o := outcome(r)))

    w.file("style.css", render.site_stylesheet())
    common = {"built_at": built_at, "pr_pages": pr_numbers, "outcome": outcome, "headline": headline}

    # the frontier: one plot per (model, metric)
    groups: dict[tuple[str, str], list[FrontierSeries]] = defaultdict(list)
    for s in series:
        groups[(s.model, s.metric)].append(s)
    frontier_plots = []
    for i, ((model, metric), group) in enumerate(groups.items()):
        rel = f"plots/frontier-{i}-{_slug(model, metric)}.svg"
        w.file(rel, plot_frontier(group, marks, f"{_METRICS.get(metric, metric)} tok/s (median)"))
        left_out = [s.context for s in group[MAX_SERIES:]]
        frontier_plots.append(
            {"model": model, "metric": metric, "src": rel, "series": group, "left_out": left_out}
        )
    history_src = None
    if history.total:
        history_src = "plots/verdict-history.svg"
        w.file(history_src, plot_verdict_history(history))

    w.page("index.html", "index.html.j2", {
        **common, "page": "index", "series": series, "history_src": history_src, "history": history,
        "prs": len(summaries), "states": states, "outcomes": outcomes, "statuses": STATUSES,
        "merges": len(marks), "open_flags": sum(1 for f in view.flags if not f.cleared), "ledgers": view,
        "blocked": len(blocked), "strikes": len(strikes), "recent": _recent(summaries, 10),
        "calibrated": bool(calibrations),
    })  # fmt: skip
    merge_rows = list(reversed(marks))
    for pager, rows in paginate(merge_rows, "frontier", per_page):
        w.page(pager.href(pager.number), "frontier.html.j2", {
            **common, "page": "frontier", "plots": frontier_plots if pager.number == 1 else [],
            "merges": rows, "pager": pager,
        })  # fmt: skip
    for pager, rows in paginate(summaries, "prs", per_page):
        w.page(
            pager.href(pager.number), "prs.html.j2", {**common, "page": "prs", "rows": rows, "pager": pager}
        )
    flags_by_pr: dict[int, list[ledgers.FlagEntry]] = defaultdict(list)
    for f in view.flags:
        flags_by_pr[f.pr].append(f)
    strikes_by_pr, clears_by_pr, ledger_by_pr = defaultdict(list), defaultdict(list), defaultdict(list)
    for s in strikes:
        strikes_by_pr[s.pr].append(s)
    for c in clears:
        clears_by_pr[c.pr].append(c)
    for e in ledger_rows:
        ledger_by_pr[e.pr].append(e)
    for s in summaries:
        latest = s.latest
        shown = s.evaluations[:MAX_PR_EVALUATIONS]
        w.page(f"pr-{s.pr}.html", "pr.html.j2", {
            **common, "page": "prs", "s": s, "shown": shown, "hidden": len(s.evaluations) - len(shown),
            "latest": latest, "forest": forest(latest.verdict.estimates) if latest and latest.verdict else None,
            "flags": flags_by_pr.get(s.pr, []), "strikes": strikes_by_pr.get(s.pr, []),
            "clears": clears_by_pr.get(s.pr, []), "ledger": ledger_by_pr.get(s.pr, []),
            "max_reasons": MAX_REASONS,
        })  # fmt: skip
    for pager, rows in paginate(list(view.flags), "flagged", per_page):
        w.page(pager.href(pager.number), "flagged.html.j2", {
            **common, "page": "ledgers", "rows": rows, "pager": pager, "ledgers": view,
        })  # fmt: skip
    for pager, rows in paginate(strikes, "strikes", per_page):
        w.page(pager.href(pager.number), "strikes.html.j2", {**common, "page": "ledgers", "rows": rows,
                                                             "pager": pager})  # fmt: skip
    for pager, rows in paginate(blocked, "blocked", per_page):
        w.page(pager.href(pager.number), "blocked.html.j2", {
            **common, "page": "ledgers", "rows": rows, "pager": pager, "ledgers": view,
        })  # fmt: skip
    w.page("ledgers.html", "ledgers.html.j2", {
        **common, "page": "ledgers", "ledgers": view, "flags": view.flags[:20], "flag_count": len(view.flags),
        "open_flags": sum(1 for f in view.flags if not f.cleared), "strikes": strikes[:20],
        "strike_count": len(strikes), "blocked_count": len(blocked), "clears": list(reversed(clears))[:50],
        "clear_count": len(clears), "credits": [e for e in reversed(ledger_rows) if e.kind == "credit"][:50],
        "copycat_authors": Counter(s.author.lower() for s in strikes).most_common(10),
    })  # fmt: skip

    noise_series = noise(calibrations)
    noise_plots = []
    by_profile: dict[str, list[NoiseSeries]] = defaultdict(list)
    # the noisiest boxes first: when the pool has more than a plot can hold, the quiet ones are left out
    for s in sorted(noise_series, key=lambda s: (-s.points[-1].noise_cv, s.box)):
        by_profile[s.profile].append(s)
    for i, (profile, group) in enumerate(sorted(by_profile.items())):
        rel = f"plots/noise-{i}-{_slug(profile)}.svg"
        w.file(rel, plot_noise(group))
        noise_plots.append({"profile": profile, "src": rel, "left_out": [g.box for g in group[MAX_SERIES:]]})
    latest_rows = latest_calibrations(calibrations)
    w.page("noise.html", "noise.html.j2", {
        **common, "page": "noise", "count": len(calibrations),
        "plots": noise_plots, "latest": latest_rows[:per_page], "latest_hidden": max(len(latest_rows) - per_page, 0),
    })  # fmt: skip

    _remove_stale(out, w.written)
    report.files = len(w.written)
    report.seconds = tick() - started
    return report


def _recent(summaries: Sequence[PrSummary], n: int) -> list[PrSummary]:
    return sorted(summaries, key=lambda s: s.last_at, reverse=True)[:n]


def _claim_folder(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise ValueError(
            f"{out}: a non-empty folder that no dashboard build wrote; refusing to write into it"
        )
    out.mkdir(parents=True, exist_ok=True)


def _remove_stale(out: Path, written: set[str]) -> None:
    manifest = out / MANIFEST
    previous = manifest.read_text(encoding="utf-8").splitlines() if manifest.is_file() else []
    for rel in previous:
        path = out / rel
        # only names this builder writes, never a path that climbs out of the folder
        if (
            rel not in written
            and re.fullmatch(r"(plots/)?[A-Za-z0-9_.-]+\.(html|svg|css)", rel)
            and path.is_file()
        ):
            path.unlink()
    manifest.write_text("".join(f"{rel}\n" for rel in sorted(written)), encoding="utf-8")
