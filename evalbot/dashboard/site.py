"""The dashboard's site: ``build_site`` renders every page through ``evalbot.render`` (the one jinja2
user) and writes it, with the plots and one CSS file, under a folder it owns. Long lists are paginated, so
every page stays far below 1 MB.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from evalbot import ledgers, render
from evalbot.dashboard.data import (
    MANIFEST,
    MAX_PR_EVALUATIONS,
    MAX_REASONS,
    MAX_SERIES,
    METRICS,
    PER_PAGE,
    STATUSES,
    FrontierSeries,
    LedgerFiles,
    NoiseSeries,
    PrSummary,
    blocked_rows,
    forest,
    frontier,
    headline,
    latest_calibrations,
    ledger_view,
    merges,
    noise,
    outcome,
    pr_summaries,
    side_bias_note,
    track_tally,
    verdict_history,
)
from evalbot.dashboard.plots import plot_frontier, plot_noise, plot_verdict_history
from evalbot.store import Store

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
        self.out, self.report = out, report
        self.written: set[str] = set()
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

    evaluations = store.queue.evaluations()
    summaries = pr_summaries(evaluations)
    series = frontier(evaluations)
    marks = merges(ledger_rows := store.rounds.ledger(), store.rounds.track_credits())
    history = verdict_history(evaluations)
    calibrations = store.calibrations.recorded()
    view = ledger_view(ledger_files or LedgerFiles())
    strikes = sorted(store.moderation.strikes(), key=lambda s: s.at, reverse=True)
    clears = store.moderation.clears()
    blocked = blocked_rows(view, store.moderation.blocklist())
    pr_numbers = {s.pr for s in summaries}
    states = Counter(r.state for r in evaluations)
    outcomes = Counter(o for r in evaluations if (o := outcome(r)))

    w.file("style.css", render.site_stylesheet())
    common = {"built_at": built_at, "pr_pages": pr_numbers, "outcome": outcome, "headline": headline}

    # the frontier: one plot per (model, metric)
    groups: dict[tuple[str, str], list[FrontierSeries]] = defaultdict(list)
    for fs in series:
        groups[(fs.model, fs.metric)].append(fs)
    frontier_plots = []
    for i, ((model, metric), group) in enumerate(groups.items()):
        rel = f"plots/frontier-{i}-{_slug(model, metric)}.svg"
        w.file(rel, plot_frontier(group, marks, f"{METRICS.get(metric, metric)} tok/s (median)"))
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
            "merges": rows, "pager": pager, "tracks": track_tally(marks) if pager.number == 1 else [],
        })  # fmt: skip
    for pager, rows in paginate(summaries, "prs", per_page):
        w.page(
            pager.href(pager.number), "prs.html.j2", {**common, "page": "prs", "rows": rows, "pager": pager}
        )
    flags_by_pr: dict[int, list[ledgers.FlagEntry]] = defaultdict(list)
    for f in view.flags:
        flags_by_pr[f.pr].append(f)
    strikes_by_pr, clears_by_pr, ledger_by_pr = defaultdict(list), defaultdict(list), defaultdict(list)
    for st in strikes:
        strikes_by_pr[st.pr].append(st)
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
    for ns in sorted(noise_series, key=lambda s: (-s.points[-1].noise_cv, s.box)):
        by_profile[ns.profile].append(ns)
    for i, (profile, boxes) in enumerate(sorted(by_profile.items())):
        rel = f"plots/noise-{i}-{_slug(profile)}.svg"
        w.file(rel, plot_noise(boxes))
        noise_plots.append({"profile": profile, "src": rel, "left_out": [g.box for g in boxes[MAX_SERIES:]]})
    latest_rows = latest_calibrations(calibrations)
    w.page("noise.html", "noise.html.j2", {
        **common, "page": "noise", "count": len(calibrations),
        "plots": noise_plots, "latest": latest_rows[:per_page], "latest_hidden": max(len(latest_rows) - per_page, 0),
        "biases": [side_bias_note(c.details) for c in latest_rows[:per_page]],
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
