"""Options and loaders shared by several commands."""

from __future__ import annotations

import os
from pathlib import Path

import click

from evalbot.rules import Profile, Rules, RulesError, default_rules_dir, load_rules

rules_option = click.option(
    "--rules",
    "rules_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="rules directory (default: the repository's rules/)",
)


def load_rules_or_exit(rules_dir: Path | None) -> Rules:
    """The validated rules, or a clean CLI error naming file:line."""
    try:
        return load_rules(rules_dir or default_rules_dir())
    except RulesError as exc:
        raise click.ClickException(str(exc)) from exc


STATE_ENV = "EVALBOT_STATE"

state_option = click.option(
    "--state", "state", type=click.Path(dir_okay=False, path_type=Path), default=None, envvar=STATE_ENV,
    show_envvar=True, help="the bot's SQLite state (default: $XDG_STATE_HOME or ~/.local/state, /evalbot/state.db)",
)  # fmt: skip


def resolve_state(path: Path | None) -> Path:
    """The state file: the given path (--state or $EVALBOT_STATE), else evalbot/state.db under the XDG state home."""
    if path is not None and str(path):
        return path
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "evalbot" / "state.db"


def _shipped_profiles() -> list[str]:
    try:
        return [p.name for p in load_rules(default_rules_dir()).profiles]
    except RulesError:
        return []


profile_option = click.option(
    "--profile", default=None, metavar="PROFILE",
    shell_complete=lambda _ctx, _param, incomplete: [n for n in _shipped_profiles() if n.startswith(incomplete)],
    help="a profile of the rules' profiles.yaml (shipped: cpu, gpu); default: the one the rules judge PRs on "
         "(dispatch.yaml's profile)",
)  # fmt: skip


def check_profile(rules: Rules, name: str | None) -> Profile:
    """The profile to measure on: the one named (a manual override), if the rules in use define it, else
    the one the rules judge PRs on; a usage error listing the defined ones for an unknown name."""
    names = [p.name for p in rules.profiles]
    if name is None:
        return rules.profile(rules.dispatch.profile)
    if name not in names:
        raise click.BadParameter(f"{name!r} is not a profile of {rules.source_dir / 'profiles.yaml'}; it defines "
                                 f"{', '.join(names) or 'none'}", param_hint="--profile")  # fmt: skip
    return rules.profile(name)
