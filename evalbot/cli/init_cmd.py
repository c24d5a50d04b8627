"""`evalbot init DEST --evalbot SPEC`: set a contest repository up to be judged by evalbot.

It writes into DEST the rules (`rules/`, `engine.yaml` among them, to edit for DEST's engine), the PR
template, and the three workflows. Each workflow installs the pinned evalbot that SPEC names, not the
repository it runs in, and reads its rules from DEST's checkout. Nothing already in DEST is overwritten
without `--force`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from evalbot.cli.options import load_rules_or_exit
from evalbot.policy.template import bench_commands, template_table
from evalbot.render import render_pr_template
from evalbot.rules import Rules

WORKFLOWS = ("evalbot-poll.yml", "evalbot-eval.yml", "pages.yml")
TEMPLATE = ".github/PULL_REQUEST_TEMPLATE.md"
# the shipped workflows install the repository they run in (this one is evalbot's own contest)
_LOCAL_INSTALL = re.compile(r"'\.\[bot\]'")
# one line, no quote: it goes verbatim into a single-quoted word of each workflow's shell step
_SPEC = re.compile(r"evalbot(\[[a-z,]+\])? ?(==|@|>=|~=) ?[^'\"\s\\][^'\"\x00-\x1f\\]*")


def pin_installs(workflow: str, spec: str) -> str:
    """A shipped workflow with its install of the checkout's evalbot replaced by the pinned SPEC. Pure."""
    if "[bot]" not in spec:
        spec = spec.replace("evalbot", "evalbot[bot]", 1)
    return _LOCAL_INSTALL.sub(lambda _m: f"'{spec}'", workflow)


def pr_template(rules: Rules) -> str:
    """The PR template the rules call for: their bench commands, table and sensitive paths."""
    model, contexts = template_table(rules)
    return render_pr_template(bench_commands(rules), model, contexts, rules.policy.sensitive_paths)


def shipped_root() -> Path:
    """Where the shipped rules, workflows and PR template are: the installed data folder, or evalbot's own
    checkout when it runs from one."""
    for root in (Path(sys.prefix) / "share" / "evalbot", Path(__file__).resolve().parents[2]):
        if (root / "rules" / "profiles.yaml").is_file() and (
            root / ".github" / "workflows" / WORKFLOWS[0]
        ).is_file():
            return root
    raise click.ClickException("this evalbot carries no rules or workflows to copy (a broken install?)")


@click.command()
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.option("--evalbot", "spec", required=True, metavar="SPEC",
              help="the pinned evalbot the workflows install, a pip requirement: "
                   "'evalbot==1.2.0' or 'evalbot @ git+https://github.com/ORG/evalbot@<sha>'")  # fmt: skip
@click.option("--force", is_flag=True, help="overwrite files DEST already has")
def init(dest: Path, spec: str, force: bool) -> None:
    """Write evalbot's rules, PR template and workflows into the contest repository DEST."""
    if not _SPEC.fullmatch(spec.strip()):
        raise click.BadParameter(
            f"expected a pip requirement for evalbot, got {spec!r}", param_hint="--evalbot"
        )
    root = shipped_root()
    files: dict[Path, str] = {}
    for path in sorted((root / "rules").glob("*.yaml")):
        files[Path("rules") / path.name] = path.read_text(encoding="utf-8")
    for name in WORKFLOWS:
        text = (root / ".github" / "workflows" / name).read_text(encoding="utf-8")
        files[Path(".github/workflows") / name] = pin_installs(text, spec.strip())
    files[Path(TEMPLATE)] = pr_template(
        load_rules_or_exit(root / "rules")
    )  # `evalbot rules pr-template` after edits
    there = [str(p) for p in files if (dest / p).exists()]
    if there and not force:
        raise click.ClickException(f"{dest} already has {', '.join(there)}: pass --force to overwrite them")
    for rel, text in files.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(text, encoding="utf-8")
        click.echo(f"wrote {dest / rel}")
    click.echo(
        "next: describe your engine in rules/engine.yaml and its models in rules/models.yaml, check it "
        f"with `evalbot engine check --repo {dest}`, write the PR template for them with `evalbot rules "
        "pr-template rules/ --out .github/PULL_REQUEST_TEMPLATE.md`, then follow docs/adopt.md for the runner "
        "and the keys"
    )
