"""`evalbot dashboard build --out DIR`: the static dashboard site from the store and the ledgers."""

from __future__ import annotations

import re
from pathlib import Path

import click

from evalbot import dashboard as dashboard_mod
from evalbot import ledgers
from evalbot.cli.options import EXISTING_DIR, STATE_ENV, resolve_state, state_option
from evalbot.store import Store, StoreError


@click.group()
def dashboard() -> None:
    """The static dashboard: frontier, verdicts, ledgers and A/A noise as HTML with SVG plots."""


@dashboard.command()
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="folder to write the site into (created; a folder a previous build wrote is updated)",
)
@state_option
@click.option(
    "--ledger-dir",
    "ledger_dir",
    type=EXISTING_DIR,
    default=None,
    help="a checkout whose .github/ holds FLAGGED.md and blocked-contributors.txt",
)
@click.option(
    "--git-remote",
    "git_remote",
    default=None,
    help=f"read the ledgers from this git remote's {ledgers.LEDGER_BRANCH} branch instead",
)
@click.option(
    "--per-page",
    default=dashboard_mod.PER_PAGE,
    show_default=True,
    type=click.IntRange(10, 1000),
    help="rows per page of the long lists",
)
def build(
    out: Path, state: Path | None, ledger_dir: Path | None, git_remote: str | None, per_page: int
) -> None:
    """Build the site: every page is static HTML (no scripts) with its plots beside it."""
    if ledger_dir is not None and git_remote is not None:
        raise click.UsageError("give --ledger-dir or --git-remote, not both")
    path = resolve_state(state)
    if not path.is_file():
        # opening a store creates it: a read-only command must not leave an empty state behind
        raise click.ClickException(f"no state at {path}: pass --state PATH or set {STATE_ENV}")
    try:
        if ledger_dir is not None:
            files = dashboard_mod.read_ledger_dir(ledger_dir)
        elif git_remote is not None:
            texts = ledgers.read_ledgers(git_remote)
            files = dashboard_mod.LedgerFiles(texts[ledgers.FLAGGED_PATH], texts[ledgers.BLOCKED_PATH],
                                              f"{_shown_remote(git_remote)} ({ledgers.LEDGER_BRANCH})")  # fmt: skip
        else:
            files = dashboard_mod.LedgerFiles()
        with Store(path) as store:
            report = dashboard_mod.build_site(store, out, ledger_files=files, per_page=per_page)
    except (StoreError, ledgers.LedgerError, ValueError, OSError) as exc:
        raise click.ClickException(_shown_remote(str(exc))) from None
    name, size = report.largest
    click.echo(f"{len(report.pages)} pages ({report.files} files) in {out} in {report.seconds:.1f} s; "
               f"largest page {name} at {size / 1000:.0f} kB with its plots")  # fmt: skip
    too_big = sorted(n for n, b in report.pages.items() if b >= dashboard_mod.PAGE_LIMIT_BYTES)
    if too_big:
        raise click.ClickException(f"pages over 1 MB: {', '.join(too_big[:10])}")


def _shown_remote(text: str) -> str:
    """Text with the credentials of any URL in it removed (the Pages workflow passes a token in the remote)."""
    return re.sub(r"//[^/@\s]*@", "//", text)
