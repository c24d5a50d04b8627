"""`evalbot rules check [DIR]`: validate a rules directory and print its hash."""

from __future__ import annotations

from pathlib import Path

import click

from evalbot.cli.options import EXISTING_DIR, load_rules_or_exit


@click.group()
def rules() -> None:
    """Inspect the YAML policy."""


@rules.command()
@click.argument("directory", required=False, type=EXISTING_DIR)
def check(directory: Path | None) -> None:
    """Validate every rules file; errors name file:line and the field."""
    r = load_rules_or_exit(directory)
    tiers = ", ".join(f"{t.name} >= {t.lower_bound:.1%}" for t in r.tiers)
    click.echo(f"OK: {r.source_dir} (rules_hash {r.rules_hash})")
    click.echo(f"tiers: {tiers}; no-regression >= {r.gates.no_regression.min_ratio}x main")
    for p in r.profiles:
        click.echo(f"profile {p.name}: contexts {', '.join(str(c.ctx) for c in p.contexts)}")
        for t in r.tracks_for(p.name):
            for e in t.models:
                where = (
                    "guard (measured, never scored)"
                    if e.guard
                    else f"scored at {', '.join(map(str, e.contexts))}"
                )
                label = f", label {e.label}:<tier>" if e.label else ""
                drafter = f", drafts by {t.drafter}" if t.metric == "spec" else ""
                overall = "" if t.overall else ", apart from the overall tier"
                own = (", its tiers " + ", ".join(f"{n} >= {b:.1%}" for n, b in t.tiers)) if t.tiers else ""
                click.echo(f"  {t.name} ({t.metric}) {e.model}: {where}{label}{drafter}{overall}{own}")


@rules.command("pr-template")
@click.argument("directory", required=False, type=EXISTING_DIR)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write it there (default: print it)")  # fmt: skip
def pr_template_cmd(directory: Path | None, out: Path | None) -> None:
    """The PR template these rules call for: the engine's bench commands, the table the bot reads, the
    paths a PR must leave alone."""
    from evalbot.cli.init_cmd import pr_template

    text = pr_template(load_rules_or_exit(directory))
    if out is None:
        click.echo(text, nl=False)
    else:
        out.write_text(text, encoding="utf-8")
        click.echo(f"wrote {out}")
