"""`evalbot evaluate`: the main job, offline. Writes report.md, result.json and receipt.json into --out.

Exit status: 0 PASS, 1 REJECT, 3 INFRA_ERROR, 4 SKIPPED, 5 INCONCLUSIVE (the box could not resolve the
smallest tier: measure again, on a quieter box or with more pairs).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from evalbot import judge, receipts, render
from evalbot.cli.options import (
    check_profile,
    file_option,
    load_rules_or_exit,
    profile_option,
    repo_option,
    rules_option,
)
from evalbot.cli.progress import reporter
from evalbot.cli.receipt_cmd import SIGNING_KEY_ENV
from evalbot.codec import to_dict
from evalbot.evaluate import checkout, runner
from evalbot.model import RunOptions, Status

EXIT = {Status.PASS: 0, Status.REJECT: 1, Status.INFRA_ERROR: 3, Status.SKIPPED: 4, Status.INCONCLUSIVE: 5}


@click.command()
@repo_option("a local git repository (or clone) holding both revisions")
@click.option("--base", required=True, help="the trusted revision (main)")
@click.option("--head", required=True, help="the revision under test")
@rules_option
@profile_option
@click.option(
    "--out", type=click.Path(file_okay=False, path_type=Path), default=Path("evalbot-out"), show_default=True
)
@click.option("--json", "as_json", is_flag=True, help="print result.json on stdout")
@click.option(
    "--no-sandbox", is_flag=True, help="run engine code without bubblewrap (only for code you trust)"
)
@click.option("--seed", type=int, default=None, help="prompt draw seed (default: a fresh random one)")
@click.option("--spec/--no-spec", default=True, help="run the speculative-decoding gates")
@click.option(
    "--spec-drafter",
    type=click.Choice(["ngram", "draft"]),
    default="ngram",
    show_default=True,
    help="how the spec pair's target drafts: n-gram lookup, or models.yaml's draft model (loaded by the target's engine: engine.yaml serve.draft); tracks.yaml may say draft for its own models",
)
@click.option("--accuracy/--no-accuracy", default=True, help="run the llama.cpp accuracy gates")
@click.option(
    "--max-pairs",
    type=int,
    default=None,
    help="cap A/B pairs per context, and the speculative runs a context (default: the profile's and the rules')",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="worktrees, venvs and build logs (default: ~/.cache/evalbot/work)",
)
@click.option(
    "--pr", type=int, default=None, help="the PR number, recorded in the result and signed into the receipt"
)
@file_option(
    "--key",
    "key_path",
    f"Ed25519 private key for the receipt (default: ${SIGNING_KEY_ENV}; none: 'unsigned')",
)
def evaluate(
    repo: Path,
    base: str,
    head: str,
    rules_dir: Path | None,
    profile: str | None,
    out: Path,
    as_json: bool,
    no_sandbox: bool,
    seed: int | None,
    spec: bool,
    spec_drafter: str,
    accuracy: bool,
    max_pairs: int | None,
    work_dir: Path | None,
    pr: int | None,
    key_path: Path | None,
) -> None:
    """Build base and head, measure them interleaved on this box, gate against llama.cpp, and judge."""
    rules = load_rules_or_exit(rules_dir, repo)
    measured_on = check_profile(rules, profile)
    raw_key = key_path.read_bytes() if key_path else (os.environ.get(SIGNING_KEY_ENV) or "").encode() or None
    try:
        key = receipts.load_private_key(raw_key) if raw_key else None
    except receipts.ReceiptError as exc:
        raise click.ClickException(f"signing key: {exc}") from exc
    work = (
        work_dir or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "evalbot" / "work"
    ).resolve()
    options = RunOptions(seed=seed, spec=spec, spec_drafter=spec_drafter, accuracy=accuracy, max_pairs=max_pairs,
                         no_sandbox=no_sandbox)  # fmt: skip
    with reporter() as (log, progress):
        ws = runner.Workspace(repo.resolve(), work, rules, progress=progress)
        try:  # the merge of head into main that is measured is made here, once
            req = runner.request(ws, base, head, measured_on, options, pr=pr)
        except checkout.BuildError as exc:
            judged = judge.judged(runner.unresolved(ws, measured_on, str(exc), pr), rules, key)
        else:
            judged = judge.judge(req, ws, log, key)
    m, v, receipt = judged.measurements, judged.verdict, judged.receipt
    status = judged.signature_status
    out.mkdir(parents=True, exist_ok=True)
    result = {"measurements": to_dict(m), "verdict": to_dict(v), "signature_status": status}
    (out / "result.json").write_text(json.dumps(result, indent=2))
    (out / "report.md").write_text(render.render_comment(v, m, signature_status=status))
    receipts.dump(receipt, out / "receipt.json")
    click.echo(f"{v.status.value}{' ' + v.tier if v.tier else ''}: {'; '.join(v.reasons)[:400]}", err=True)
    click.echo(
        f"wrote {out / 'report.md'}, {out / 'result.json'}, {out / 'receipt.json'} ({status})", err=True
    )
    if as_json:
        click.echo(json.dumps(result))
    sys.exit(EXIT[v.status])
