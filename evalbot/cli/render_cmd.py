"""`evalbot render --verdict FILE`: preview the PR comment for a result.json."""

from __future__ import annotations

from pathlib import Path

import click

from evalbot import render as render_mod
from evalbot.cli.options import file_option


@click.command()
@file_option("--verdict", "verdict_file", "a result.json", required=True)
def render(verdict_file: Path) -> None:
    """Print the markdown comment the bot would post for this result."""
    try:
        click.echo(render_mod.render_verdict_file(verdict_file))
    except (ValueError, TypeError, OSError) as exc:
        raise click.ClickException(f"{verdict_file}: {' '.join(str(exc).split())[:500]}") from exc
    except RecursionError as exc:
        raise click.ClickException(f"{verdict_file}: nested too deeply to be a result.json") from exc
