"""The dashboard's plots: its data drawn with matplotlib into SVG text, each series downsampled so a plot
stays small however many PRs the store holds.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from evalbot.dashboard.data import (
    MAX_PLOT_POINTS,
    MAX_SERIES,
    PALETTE,
    STATUS_COLORS,
    STATUSES,
    FrontierSeries,
    MergeMark,
    NoisePoint,
    NoiseSeries,
    VerdictHistory,
    chunks,
    clip_text,
    downsample,
    next_period,
    signed_pct,
)

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
                linewidth=1.3, drawstyle="steps-post", color=PALETTE[i % len(PALETTE)],
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
            ax.annotate(f"#{m.pr} {signed_pct(m.gain or 0.0, 1)}", xy=(m.at, 0.97), xycoords=rug, fontsize=8,
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
    ends = [next_period(s, history.unit) for s in history.starts]
    widths = [(e - s).total_seconds() / 86400 * 0.85 for s, e in zip(history.starts, ends, strict=True)]
    bottom = [0] * len(history.starts)
    for status in STATUSES:
        counts = history.counts.get(status, ())
        if not any(counts):
            continue
        ax.bar(history.starts, counts, width=widths, bottom=bottom, align="edge", color=STATUS_COLORS[status],
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
                    markersize=2.5, linewidth=1.1, color=PALETTE[i % len(PALETTE)],
                    label=clip_text(s.box, 30))  # fmt: skip
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
    return [
        NoisePoint(run[len(run) // 2].at, max(p.noise_cv for p in run), max(p.mde for p in run),
                   max(p.false_positive_rate for p in run), sum(p.rows for p in run))
        for run in chunks(points, limit)
    ]  # fmt: skip
