"""The dashboard: a static site (HTML, one CSS file, SVG plots) built from the store and the ledgers.

Three modules, three layers (data, plots, site). Pure functions turn store rows into page data (the frontier of main, PR summaries, the
verdict history, the A/A noise of the runner pool). Plot functions draw that data with matplotlib into
SVG text, bounded in points so that no page grows with the number of PRs. ``build_site`` is the only
I/O: it renders every page through ``evalbot.render`` (the one jinja2 user) and writes it under a folder.

Long lists (PRs, flags, strikes, merges) are paginated, a PR's own page keeps its newest evaluations,
and every plot is downsampled: every page stays far below 1 MB however many PRs the store holds.
"""

from evalbot.dashboard.data import (
    PAGE_LIMIT_BYTES,
    PER_PAGE,
    FrontierPoint,
    LedgerFiles,
    downsample,
    forest,
    frontier,
    ledger_view,
    merges,
    outcome,
    read_ledger_dir,
    verdict_history,
)
from evalbot.dashboard.site import SiteReport, build_site, paginate

__all__ = [
    "PAGE_LIMIT_BYTES",
    "PER_PAGE",
    "FrontierPoint",
    "LedgerFiles",
    "SiteReport",
    "build_site",
    "downsample",
    "forest",
    "frontier",
    "ledger_view",
    "merges",
    "outcome",
    "paginate",
    "read_ledger_dir",
    "verdict_history",
]
