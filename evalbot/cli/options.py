"""Options and loaders shared by several commands."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from evalbot.rules import Profile, Rules, RulesError, default_rules_dir, load_rules

EXISTING_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
EXISTING_DIR = click.Path(exists=True, file_okay=False, path_type=Path)
Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def file_option(flag: str, dest: str, help: str, *, required: bool = False) -> Decorator:
    """An option naming an existing file, passed as a Path."""
    return click.option(flag, dest, required=required, type=EXISTING_FILE, help=help)


def repo_option(help: str) -> Decorator:
    """--repo: a local git repository, passed as a Path."""
    return click.option("--repo", required=True, type=EXISTING_DIR, help=help)


rules_option = click.option(
    "--rules",
    "rules_dir",
    type=EXISTING_DIR,
    default=None,
    help="rules directory (default: rules/ of the checkout evalbot runs in, or of --repo where given)",
)


def load_rules_or_exit(rules_dir: Path | None, repo: Path | None = None) -> Rules:
    """The validated rules (by default the rules/ of `repo`, else of the checkout around the working
    directory), or a clean CLI error naming file:line."""
    try:
        return load_rules(rules_dir or default_rules_dir(repo))
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
    help="a profile of the rules' profiles.yaml (shipped: cpu, cpu-both, gpu); default: the one the rules judge PRs on "
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
