"""`evalbot calibrate`: judge main against main N times on this box; store and print the false-positive
rate, the minimum detectable effect and the noise per (model, context).

Exit status: 0 when at least one run reached a verdict (rows stored), 3 when none did.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

import click

from evalbot import calibrate as calibrate_mod
from evalbot.cli.options import (
    check_profile,
    load_rules_or_exit,
    profile_option,
    repo_option,
    resolve_state,
    rules_option,
    state_option,
)
from evalbot.codec import to_dict
from evalbot.evaluate import checkout, runner
from evalbot.model import RunOptions
from evalbot.rules import Tier
from evalbot.store import Store, StoreError, iso

BOX_ENV = "RUNNER_NAME"  # set by GitHub Actions runners; the host name elsewhere


def _log(message: str) -> None:
    click.echo(f"evalbot: {message}", err=True)


@click.command()
@repo_option("a local git repository (or clone) holding the revision")
@click.option("--rev", default="main", show_default=True, help="the revision judged against itself")
@click.option(
    "--runs",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="A/A evaluations (each a full evaluate: fresh processes, fresh prompt seed)",
)
@rules_option
@profile_option
@click.option(
    "--max-pairs", type=int, default=None, help="cap A/B pairs per context (default: the profile's)"
)
@click.option("--spec/--no-spec", default=True, help="run the speculative-decoding gates in each run")
@click.option("--accuracy/--no-accuracy", default=True, help="run the llama.cpp accuracy gates in each run")
@click.option(
    "--box",
    default=None,
    envvar=BOX_ENV,
    show_envvar=True,
    help="this box's name in the store (default: the host name)",
)
@state_option
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="worktrees, venvs and build logs (default: ~/.cache/evalbot/work)",
)
@click.option("--json", "as_json", is_flag=True, help="print the summary as one JSON object")
@click.option(
    "--no-sandbox",
    is_flag=True,
    help="run without bubblewrap (a box without it; both sides are the same trusted revision)",
)
def calibrate(repo: Path, rev: str, runs: int, rules_dir: Path | None, profile: str | None,
              max_pairs: int | None,
              spec: bool, accuracy: bool, box: str | None, state: Path | None, work_dir: Path | None,
              as_json: bool, no_sandbox: bool) -> None:  # fmt: skip
    """Judge REV against itself RUNS times on this box: how often equal code gets a tier or a regression
    call, and the smallest gain the box resolves. Run it before trusting a new runner."""
    rules = load_rules_or_exit(rules_dir, repo)
    measured_on = check_profile(rules, profile)
    profile = measured_on.name
    box = box or platform.node() or "unknown"
    state = resolve_state(state)
    work = work_dir or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "evalbot" / "work"
    ws = runner.Workspace(repo.resolve(), work.resolve(), rules)
    options = RunOptions(spec=spec, accuracy=accuracy, max_pairs=max_pairs, no_sandbox=no_sandbox)
    try:
        aa = calibrate_mod.run(ws, rev, measured_on, options, runs, _log)
    except checkout.BuildError as exc:
        raise click.ClickException(str(exc)) from exc
    summary = calibrate_mod.summarize(aa, box=box, at=iso(), rules=rules)
    if summary.rows:
        state.parent.mkdir(parents=True, exist_ok=True)
        try:
            with Store(state) as store:
                for row in summary.rows:
                    store.calibrations.record(row)
        except StoreError as exc:
            raise click.ClickException(f"state {state}: {exc}") from exc
    if as_json:
        click.echo(json.dumps({
            "box": box, "profile": profile, "rev": rev, "runs": summary.runs, "completed": summary.completed,
            "verdict_false_positive_rate": summary.verdict_false_positive_rate, "failures": list(summary.failures),
            "rows": [to_dict(r) for r in summary.rows], "state": str(state),
            "spec": [{**to_dict(r), "runs": r.runs, "mde_median": r.mde_median} for r in summary.spec],
        }))  # fmt: skip
    else:
        _render(summary, box, profile, rev, state, lowest_tier=rules.tiers[0] if rules.tiers else None)
    sys.exit(0 if summary.rows else 3)


def _render(summary: calibrate_mod.CalibrationSummary, box: str, profile: str, rev: str, state: Path,
            lowest_tier: Tier | None) -> None:  # fmt: skip
    click.echo(f"calibration of {box} ({profile} profile): {rev} against itself, "
               f"{summary.completed} of {summary.runs} runs reached a verdict")  # fmt: skip
    if summary.verdict_false_positive_rate is not None:
        click.echo(f"false verdicts (anything but PASS without a tier): {summary.verdict_false_positives} of "
                   f"{summary.completed} ({summary.verdict_false_positive_rate:.0%})")  # fmt: skip
    if summary.rows:
        click.echo(
            f"{'model':<24} {'ctx':>6} {'runs':>5} {'false+':>7} {'MDE med':>8} {'MDE max':>8} {'noise':>7}"
        )
    for c in summary.rows:
        click.echo(f"{c.model:<24} {c.context:>6} {c.runs:>5} {c.false_positive_rate:>7.0%} {c.mde:>8.2%} "
                   f"{c.details['mde_max']:>8.2%} {c.noise_cv:>7.2%}")  # fmt: skip
    if lowest_tier is not None and summary.rows:
        name, bound = lowest_tier.name, lowest_tier.lower_bound
        worst = max(summary.rows, key=lambda c: c.mde)
        if worst.mde <= bound:
            click.echo(f"every context resolves the lowest tier ({name}, +{bound:.1%}) at 80% power")
        else:
            click.echo(f"ctx {worst.context} cannot resolve the lowest tier ({name}, +{bound:.1%}): median MDE "
                       f"{worst.mde:.1%}; more pairs per context or a quieter box")  # fmt: skip
    for sp in summary.spec:
        lossless = sum(k for k, _ in sp.lossless), sum(n for _, n in sp.lossless)
        click.echo(f"speculative rate, {sp.model} ctx {sp.context}: {sp.runs} runs, {sp.tiers_awarded} with a tier, "
                   f"MDE median {sp.mde_median:.2%} (max {max(sp.mdes):.2%}), ratios "
                   f"{', '.join(f'{r:.4f}x' for r in sp.ratios)}; {lossless[0]}/{lossless[1]} spec runs lossless")  # fmt: skip
    for c in summary.rows:
        bias = c.details.get("side_bias")
        if bias and bias["agreed"]:
            who = "main" if bias["change"] < 0 else "the PR"
            click.echo(f"{c.model} ctx {c.context}: the runs agree on a bias of {bias['change']:+.2%} (t "
                       f"{bias['t']:+.1f} over {bias['runs']} runs, past {bias['t_needed']:.1f}): equal code "
                       f"reads {who} faster on this box, and every PR's score moves with it")  # fmt: skip
    for failure in summary.failures:
        click.echo(f"no verdict: {failure}", err=True)
    if summary.rows:
        click.echo(f"stored {len(summary.rows)} row(s) in {state}")
    else:
        click.echo("no run reached a verdict; nothing stored", err=True)
