"""`evalbot`: the maintainers' command line. A bare click group; one module per command group.

Commands only parse -> call -> render. Secrets (signing keys) are read here, at the entry point, from
a path or an environment variable, and passed down as objects.
"""

from __future__ import annotations

import click

from evalbot.cli import (
    bot_cmd,
    copycat_cmd,
    dashboard_cmd,
    engine_cmd,
    evaluate_cmd,
    init_cmd,
    receipt_cmd,
    render_cmd,
    rules_cmd,
    stats_cmd,
)
from evalbot.cli.calibrate_cmd import calibrate


class _Group(click.Group):
    """The command group: whatever a command raises becomes one line and a non-zero exit, never a
    traceback (a maintainer's typo, a hostile file, a GitHub outage all read as errors, not crashes)."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except RecursionError as exc:
            raise click.ClickException("the input is nested too deeply to read") from exc
        except Exception as exc:
            text = " ".join(str(exc).split())[:500] or "no details"
            raise click.ClickException(f"{type(exc).__name__}: {text}") from exc


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """evalbot: a trustworthy judge for inference-engine speed contests."""


main.add_command(rules_cmd.rules)
main.add_command(stats_cmd.stats)
main.add_command(receipt_cmd.receipt)
main.add_command(render_cmd.render)
main.add_command(evaluate_cmd.evaluate)
main.add_command(calibrate)
main.add_command(dashboard_cmd.dashboard)
main.add_command(copycat_cmd.copycat)
main.add_command(engine_cmd.engine)
main.add_command(init_cmd.init)
for _command in bot_cmd.COMMANDS:
    main.add_command(_command)
