"""`evalbot`: the maintainers' command line. A bare click group; one module per command group.

Commands only parse -> call -> render. Secrets (signing keys) are read here, at the entry point, from
a path or an environment variable, and passed down as objects.
"""

from __future__ import annotations

import click

from evalbot.cli import bot_cmd, dashboard_cmd, evaluate_cmd, receipt_cmd, render_cmd, rules_cmd, stats_cmd
from evalbot.cli.calibrate_cmd import calibrate


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """evalbot: a trustworthy judge for inference-engine speed contests."""


main.add_command(rules_cmd.rules)
main.add_command(stats_cmd.stats)
main.add_command(receipt_cmd.receipt)
main.add_command(render_cmd.render)
main.add_command(evaluate_cmd.evaluate)
main.add_command(calibrate)
main.add_command(dashboard_cmd.dashboard)
for _command in bot_cmd.COMMANDS:
    main.add_command(_command)
