"""`evalbot engine check`: the conformance kit (docs/protocol.md) against a contest's engine, built and
started as the judge builds and starts it: the revision's tree into a venv of its own (sandboxed, no
network), then served as the rules' engine.yaml declares, under bubblewrap. One line a requirement."""

from __future__ import annotations

import os
import sys
import tempfile
from functools import partial
from pathlib import Path

import click

from evalbot.cli.options import load_rules_or_exit, repo_option, rules_option
from evalbot.evaluate import builds, checkout, conformance, protocols, sandbox, served
from evalbot.evaluate.context import confine_build, ro_binds


@click.group()
def engine() -> None:
    """The contest's engine, as engine.yaml declares it."""


@engine.command()
@repo_option("the contest repository (a local git checkout)")
@click.option("--rev", default="HEAD", show_default=True, help="the revision whose engine is checked")
@rules_option
@click.option("--shape", default=None, help="serve a shape with random weights (default: the rules' first)")
@click.option("--model", "model", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="serve this model file instead of a shape")  # fmt: skip
@click.option("--device", default="cpu", show_default=True, help="the device the engine is started on")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="where the checkout and the built venv go (default: a temporary folder)")  # fmt: skip
@click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True,
              help="seconds the engine may take to start, or to answer one request")  # fmt: skip
@click.option("--no-sandbox", is_flag=True, help="run the engine without bubblewrap (only code you trust)")
def check(repo: Path, rev: str, rules_dir: Path | None, shape: str | None, model: Path | None, device: str,
          work_dir: Path | None, timeout_s: float, no_sandbox: bool) -> None:  # fmt: skip
    """Build REV's engine as the judge does and check it against every requirement of its protocol."""
    rules = load_rules_or_exit(rules_dir, repo)
    spec = rules.engine
    toolchain = [Path(p) for p in spec.toolchain]
    if model is None and shape is None:
        shapes = [
            m.name for p in rules.profiles if p.device == device for m in p.models if m.source == "shape"
        ]
        if not shapes:
            raise click.UsageError(f"the rules' {device} profiles name no shape with random weights: pass "
                                   "--shape or --model")  # fmt: skip
        shape = shapes[0]
    if not no_sandbox and not sandbox.sandbox_available():
        raise click.ClickException("bubblewrap cannot make its namespaces here: pass --no-sandbox to check "
                                   "an engine you trust without it")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="evalbot-engine-check-") as tmp:
        root = work_dir or Path(tmp)
        try:
            wt = checkout.prepare_worktree(repo, rev, root / "checkouts")
        except Exception as exc:
            raise click.ClickException(f"cannot check out {rev}: {exc}") from exc
        click.echo(f"building {rev} ({wt.sha[:12]}) as the judge does ...", err=True)
        built = builds.build_env(wt, root / "venvs", python=sys.executable, log_dir=root / "logs",
                                 timeout_s=1800, import_name=spec.package, commands=spec.commands, toolchain_paths=spec.toolchain,
                                 project=spec.project, confine=None if no_sandbox else partial(confine_build, extra=toolchain))  # fmt: skip
        if not built.ok or built.venv is None:
            click.echo(built.log_tail, err=True)
            raise click.ClickException(f"the build failed ({built.failure_stage}): {built.message}")
        model_args = spec.model_args(model=str(model)) if model is not None else spec.model_args(shape=shape)
        port = protocols.port_for(spec.protocol, not no_sandbox)
        argv = spec.serve_argv(model_args, python=str(built.venv / "bin" / "python"),
                               tree=str(built.venv / builds.TREE), max_seq="4096", device=device,
                               warmup="1", port=port, threads="1")  # fmt: skip
        try:
            how = protocols.serving(spec.protocol, argv, port, model)
        except protocols.ProtocolError as exc:
            raise click.ClickException(str(exc)) from exc
        scratch = root / "serve"
        scratch.mkdir(parents=True, exist_ok=True)
        env = sandbox.scrub_env(os.environ) | {
            "HOME": str(scratch), "TMPDIR": str(scratch), "XDG_CACHE_HOME": str(scratch / ".cache"),
            "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
        }  # fmt: skip
        binds = [
            built.venv,
            *toolchain,
            *how.binds,
            *([model.resolve()] if model is not None else []),
        ]  # the file alone
        serve_spec = sandbox.SandboxSpec(
            ro_binds=tuple(ro_binds(binds)), scratch=scratch, workdir=scratch, env=env,
            limits=sandbox.Limits(timeout_s=timeout_s * 20, max_output_bytes=64 << 20),
            devices=sandbox.gpu_devices() if device == "cuda" else (),
        )  # fmt: skip

        def start() -> served.ServedProcess:
            return served.ServedProcess.start(conformance.LABEL, serve_spec, how.argv, no_sandbox=no_sandbox,
                                              protocol=spec.protocol)  # fmt: skip

        click.echo(f"serving: {' '.join(how.argv)}", err=True)
        outcomes = conformance.check(start, timeout_s)
    for o in outcomes:
        click.echo(o.line())
    failed = [o.id for o in outcomes if not o.passed]
    if failed:
        raise click.ClickException(
            f"{len(failed)} of {len(outcomes)} requirements failed: {', '.join(failed)}"
        )
    click.echo(f"all {len(outcomes)} requirements of {spec.protocol} hold")
