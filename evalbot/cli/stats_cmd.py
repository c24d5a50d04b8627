"""`evalbot stats --pairs FILE`: the paired A/B estimate, CI, tier and MDE of measured pairs."""

from __future__ import annotations

import json
from pathlib import Path

import click

from evalbot import stats as stats_mod
from evalbot.cli.options import file_option, load_rules_or_exit, rules_option


@click.command()
@file_option(
    "--pairs",
    "pairs_file",
    "TSV or CSV with a header naming `base` and `head`, one interleaved pair per row",
    required=True,
)
@rules_option
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of text")
def stats(pairs_file: Path, rules_dir: Path | None, as_json: bool) -> None:
    """Ratio head/base (geometric mean), 95% CI, tier from the CI's lower bound, and the MDE."""
    rules = load_rules_or_exit(rules_dir)
    try:
        pairs = stats_mod.read_pairs(pairs_file.read_text(encoding="utf-8"))
        est = stats_mod.estimate(pairs)
    except (stats_mod.StatsError, UnicodeDecodeError) as exc:
        raise click.ClickException(f"{pairs_file}: {exc}") from exc
    tolerance = rules.gates.no_regression.min_ratio
    cls = stats_mod.classify(est, rules.tier_bounds, tolerance)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "n": est.n,
                    "ratio": est.ratio,
                    "ci_low": est.ci_low,
                    "ci_high": est.ci_high,
                    "gain": est.gain,
                    "lower_bound_gain": est.lower_bound_gain,
                    "half_width": est.half_width,
                    "mde": est.mde,
                    "p_value": est.p_value,
                    "tier": cls.tier,
                    "regression": cls.regression,
                    "rules_hash": rules.rules_hash,
                }
            )
        )
        return
    click.echo(f"pairs      {est.n}")
    click.echo(f"ratio      {est.ratio:.4f}x  ({est.gain:+.2%})")
    click.echo(
        f"95% CI     [{est.ci_low:.4f}x, {est.ci_high:.4f}x]  ({est.ci_low - 1:+.2%} .. {est.ci_high - 1:+.2%})"
    )
    click.echo(f"tier       {cls.tier or 'none'}  (from the CI's lower bound)")
    click.echo(f"regression {'yes' if cls.regression else 'no'}  (CI upper bound vs {tolerance}x)")
    click.echo(f"MDE        {est.mde:.2%}  (smallest gain these pairs detect with 80% power)")
