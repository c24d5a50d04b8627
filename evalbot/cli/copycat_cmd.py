"""`evalbot copycat scan DIR [--json]`: the copycat check over a folder of diffs, offline."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click

from evalbot.cli.options import EXISTING_DIR, load_rules_or_exit, rules_option


@click.group()
def copycat() -> None:
    """Copycat checks a maintainer runs by hand."""


@copycat.command()
@click.argument("directory", type=EXISTING_DIR)
@rules_option
@click.option("--json", "as_json", is_flag=True, help="one JSON list instead of text")
def scan(directory: Path, rules_dir: Path | None, as_json: bool) -> None:
    """Check NNNN-author.diff files in opening order (a base/ tree stands for main): band, the most
    contained earlier PR, and the containment."""
    from evalbot import copycat

    rules = load_rules_or_exit(rules_dir)
    try:
        rows = copycat.scan(directory, rules)
    except copycat.ScanError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(r) for r in rows]))
        return
    for r in rows:
        original = f"#{r.original:04d}" if r.original is not None else "-"
        click.echo(
            f"#{r.number:04d} {r.author:<20} {r.band:<13} {original:<6} containment {r.containment:.0%}"
            f" literal {r.literal_overlap:.0%}"
        )
