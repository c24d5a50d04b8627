"""Options and loaders shared by several commands."""

from __future__ import annotations

from pathlib import Path

import click

from evalbot.rules import Rules, RulesError, default_rules_dir, load_rules

rules_option = click.option(
    "--rules", "rules_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
    help="rules directory (default: the repository's rules/)",
)


def load_rules_or_exit(rules_dir: Path | None) -> Rules:
    """The validated rules, or a clean CLI error naming file:line."""
    try:
        return load_rules(rules_dir or default_rules_dir())
    except RulesError as exc:
        raise click.ClickException(str(exc)) from exc
