"""`evalbot render --verdict FILE`: preview the PR comment for a result.json."""

from __future__ import annotations

from pathlib import Path

import click

from evalbot import render as render_mod


@click.command()
@click.option("--verdict", "verdict_file", required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path), help="a result.json")
def render(verdict_file: Path) -> None:
    """Print the markdown comment the bot would post for this result."""
    try:
        click.echo(render_mod.render_verdict_file(verdict_file))
    except (ValueError, OSError) as exc:
        raise click.ClickException(f"{verdict_file}: {exc}") from exc
