"""The main job: build base and head from source, run them sandboxed and interleaved, return Measurements.

Trust: the harness (this bot, the rules, the prompt corpus, the reference) comes from the trusted
side; a head touching a sensitive path is SKIPPED before anything of it runs. Engine processes are
fresh for every run, alternate base/head (ABBA, so in-pair drift cancels too), run under bubblewrap
with a scrubbed environment, and their JSON is validated before a number is believed. Who failed
decides the outcome class: the head alone (REJECT) or the base/box too (INFRA_ERROR).
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from evalbot.evaluate import box, builds, checkout, prompts, sandbox
from evalbot.evaluate.context import (
    Log,
    RunContext,
    SideBuild,
    SideFailed,
    Workspace,
    confine_build,
    ro_binds,
    toolchain_paths,
)
from evalbot.evaluate.harness import harness_drift, harness_fingerprint
from evalbot.evaluate.reference import fetch_models, llama_reference, model_binds, sha_of
from evalbot.evaluate.served_model import measure_model
from evalbot.evaluate.speculative import drafter_for, drafts
from evalbot.model import (
    AccuracyResult,
    DecodeAudit,
    EvalRequest,
    Failure,
    Measurements,
    Provenance,
    RunOptions,
    Side,
    SpecResult,
    ThroughputPairs,
)
from evalbot.policy.sensitive_paths import harness_hits
from evalbot.rules import Profile


def request(
    ws: Workspace, base: str, head: str, profile: Profile, options: RunOptions, **pr: Any
) -> EvalRequest:
    """The request for base and head as named in ws.repo (refs or shas), with the one merge of the head
    into main that is measured (None where they conflict); checkout.BuildError for a name git does not
    know. `pr`: the PR's number, title, author and branch, where there is one."""
    base_sha, _ = checkout.resolve(ws.repo, base)
    head_sha, _ = checkout.resolve(ws.repo, head)
    measured = checkout.merge_commit(ws.repo, base_sha, head_sha)
    return EvalRequest(base_sha, head_sha, measured, ws.rules.rules_hash, profile, options, **pr)


def unresolved(ws: Workspace, profile: Profile, why: str, pr: int | None = None) -> Measurements:
    """What an evaluation records when no request could be made (a revision git does not know)."""
    now = box.now()
    prov = Provenance(repo=str(ws.repo), base_sha="", head_sha="", harness_sha="", rules_hash=ws.rules.rules_hash,
                      profile=profile.name, started_at=now, finished_at=now, pr=pr, box=box.identity())  # fmt: skip
    return Measurements(provenance=prov, failures=(Failure(Side.HARNESS, "git", why),))


def evaluate(req: EvalRequest, ws: Workspace, log: Log) -> Measurements:
    """Run the whole evaluation; every failure ends up in Measurements.failures, never as an exception.

    The harness's own steps come first and fail fast with their cause: main's build, the models, and
    the llama.cpp reference (computed or loaded from its cache). Only then is the PR built, and only on
    a quiet box are the A/B pairs run. The PR's checkout is removed afterwards (main's is kept for the
    next evaluation; the builds' venvs are cached by tree, not by checkout).
    """
    ws = dataclasses.replace(
        ws, work_root=ws.work_root.resolve(), repo=ws.repo.resolve()
    )  # run from anywhere
    m = _evaluate(req, ws, log)
    if req.measured_sha and req.measured_sha != req.base_sha:
        try:
            checkout.remove_worktree(ws.work_root / "worktrees", req.measured_sha)
        except (OSError, ValueError) as exc:  # disk housekeeping never costs a verdict
            log(f"could not remove the PR's checkout {req.measured_sha[:12]}: {exc}")
    return m


class _Stop(Exception):
    """A step that ends the evaluation early, with what to record: failures, or why it was skipped."""

    def __init__(self, *failures: Failure, skipped: str | None = None):
        super().__init__(skipped or "; ".join(f.message for f in failures))
        self.failures, self.skipped = failures, skipped


@dataclass
class _Record:
    """What the steps have found so far, and the Measurements it makes once they end."""

    prov: Provenance
    reproduce: str
    samples: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def done(self, **kw: Any) -> Measurements:
        p = dataclasses.replace(self.prov, finished_at=box.now())
        return Measurements(provenance=p, reproduce=self.reproduce, box_samples=tuple(self.samples), **kw)


def _evaluate(req: EvalRequest, ws: Workspace, log: Log) -> Measurements:
    """The steps, in order; each returns its typed part of the Provenance, or ends the run (_Stop)."""
    seed = req.options.seed if req.options.seed is not None else prompts.fresh_seed()
    corpus = prompts.default_corpus_dir()
    rec = _Record(_provenance(req, ws, seed, corpus), _reproduce(req, ws, seed))
    try:
        _admit(req, ws)
        base_wt, head_wt = _checkouts(req, ws)
        with tempfile.TemporaryDirectory(prefix="evalbot-run-") as tmp:
            ctx = RunContext(req, ws, log, Path(tmp), profile_device=req.profile.device,
                             engine_threads=req.profile.measurement.threads,
                             run_timeout_s=req.profile.measurement.run_timeout_s,
                             max_output_bytes=req.profile.measurement.max_output_mb << 20)  # fmt: skip
            ctx.box_samples = rec.samples
            _build(ctx, Side.BASE, base_wt)
            harness = _harness(ctx, corpus, seed, rec)
            try:
                _build(ctx, Side.HEAD, head_wt)
            finally:
                rec.prov = _engine_builds(ctx).into(rec.prov)
            _check_drift(ctx)
            return rec.done(**_measure(ctx, harness, corpus, seed).fields())
    except _Stop as stop:
        return rec.done(failures=stop.failures, skipped_reason=stop.skipped)


def _provenance(req: EvalRequest, ws: Workspace, seed: int, corpus: Path) -> Provenance:
    """The provenance every run records from its start: the request, the prompts, the box."""
    return Provenance(repo=str(ws.repo), base_sha=req.base_sha, head_sha=req.head_sha, harness_sha=req.base_sha,
                      measured_sha=req.measured_sha or "", rules_hash=req.rules_hash, profile=req.profile.name,
                      prompt_seed=seed, corpus_sha256=prompts.corpus_sha256(corpus), started_at=box.now(),
                      box=box.identity(), **req.pr_identity())  # fmt: skip


def _reproduce(req: EvalRequest, ws: Workspace, seed: int) -> str:
    """The command that runs this evaluation again on a maintainer's box."""
    o = req.options
    own = (Path(ws.repo) / "rules").resolve() == Path(ws.rules.source_dir).resolve()
    return (
        f"evalbot evaluate --repo {ws.repo} --base {req.base_sha} --head {req.head_sha} "
        f"--profile {req.profile.name} --seed {seed}"
        + ("" if own else f" --rules {ws.rules.source_dir}")  # rules other than the checkout's own
        + ("" if o.spec else " --no-spec")
        + (f" --spec-drafter {o.spec_drafter}" if o.spec and o.spec_drafter != "ngram" else "")
        + ("" if o.accuracy else " --no-accuracy")
        + (f" --max-pairs {o.max_pairs}" if o.max_pairs else "")
    )


def _admit(req: EvalRequest, ws: Workspace) -> None:
    """What may be run at all: the rules the request names, a head that merges, no sensitive path, and
    bubblewrap for the PR's code."""
    if req.rules_hash != ws.rules.rules_hash:
        raise _Stop(Failure(Side.HARNESS, "rules", f"the request names rules {req.rules_hash[:12]}, this box "
                            f"has {ws.rules.rules_hash[:12]}: measured under other rules, it could not be judged"))  # fmt: skip
    if req.measured_sha is None:
        raise _Stop(skipped=f"the PR conflicts with main {req.base_sha[:12]}: rebase it and push")
    try:
        hits = harness_hits(checkout.changed_paths(ws.repo, req.base_sha, req.head_sha), ws.rules)
    except checkout.BuildError as exc:
        raise _Stop(Failure(Side.HARNESS, "git", str(exc))) from exc
    if hits:
        # names come from git with surrogateescape: show undecodable bytes as U+FFFD, never crash on them
        shown = ", ".join(h.encode("utf-8", "surrogateescape").decode("utf-8", "replace") for h in hits[:8])
        shown += " …" if len(hits) > 8 else ""
        raise _Stop(skipped=f"the PR changes sensitive paths, which the bot never runs: {shown}")
    if not req.options.no_sandbox and not sandbox.sandbox_available():
        why = "bubblewrap is not available; refusing to run untrusted code (pass --no-sandbox to override)"
        raise _Stop(Failure(Side.HARNESS, "sandbox", why))


def _checkouts(req: EvalRequest, ws: Workspace) -> tuple[checkout.Worktree, checkout.Worktree]:
    """Main's and the measured merge's trees, checked out (or reused where intact)."""
    assert req.measured_sha is not None  # _admit
    ws.work_root.mkdir(parents=True, exist_ok=True)
    try:
        base = checkout.prepare_worktree(ws.repo, req.base_sha, ws.work_root / "worktrees")
        return base, checkout.prepare_worktree(ws.repo, req.measured_sha, ws.work_root / "worktrees")
    except checkout.BuildError as exc:
        raise _Stop(Failure(Side.HARNESS, "git", str(exc))) from exc


def _build(ctx: RunContext, side: Side, wt: checkout.Worktree) -> None:
    """Build one revision into its venv (main's first, as part of the harness); _Stop with the side's
    failure when it does not build."""
    ctx.log(f"building {side.value} {wt.sha[:12]}")
    b = builds.build_env(
        wt,
        ctx.ws.work_root / "venvs",
        python=ctx.ws.python,
        log_dir=ctx.ws.work_root / "logs",
        timeout_s=1800,
        import_name=ctx.ws.rules.engine.package,
        commands=ctx.ws.rules.engine.commands,
        toolchain_paths=ctx.ws.rules.engine.toolchain,
        project=ctx.ws.rules.engine.project,
        confine=None if ctx.req.options.no_sandbox else partial(confine_build, extra=toolchain_paths(ctx)),
    )
    ctx.sides[side] = SideBuild(side, wt, b)
    if not b.ok:
        raise _Stop(Failure(side, b.failure_stage or "build", b.message, b.log_tail))


@dataclass(frozen=True)
class _Harness:
    """The harness's step: the models on this box, and the llama.cpp reference's logits per model."""

    models: dict[str, Path]
    references: dict[str, Path]


@dataclass(frozen=True)
class HarnessProvenance:
    """The harness's part of the Provenance: the models' sha256s, the reference's identity per model."""

    model_sha256s: dict[str, str]
    reference: dict[str, Any]

    def into(self, p: Provenance) -> Provenance:
        return dataclasses.replace(p, model_sha256s=self.model_sha256s, reference=self.reference)


def _harness(ctx: RunContext, corpus: Path, seed: int, rec: _Record) -> _Harness:
    """The models and the reference, each failing fast with its cause (recorded as far as it got)."""
    profile = ctx.req.profile
    try:
        models = fetch_models(ctx, profile)
    except SideFailed as exc:
        raise _Stop(exc.failure) from exc
    pair = ctx.ws.rules.spec_pair
    files = {m.name for m in (*profile.models, pair.target, pair.draft) if m.source == "file"}
    ctx.ro_binds = ro_binds(model_binds(models, files))
    ctx.model_paths = dict(models)
    draws = prompts.draw(corpus, seed, n_chars=8 * max(c.ctx for c in profile.contexts) + 4000, k=2)
    prompt_files = prompts.write_prompt_files(draws, ctx.scratch / "prompts")
    on_runner = {m.name: m.sha256 for m in profile.models if m.source == "file"}  # checked whole just now
    shas = {name: on_runner.get(name) or sha_of(ctx, path) for name, path in models.items()}
    references: dict[str, Path] = {}
    identities: dict[str, Any] = {}
    try:
        for ref in profile.models if ctx.req.options.accuracy else ():
            if ref.has_weights:
                references[ref.name], identities[ref.name] = llama_reference(
                    ctx, models[ref.name], prompt_files[1]
                )
    except SideFailed as exc:
        raise _Stop(exc.failure) from exc
    finally:
        rec.prov = HarnessProvenance(shas, identities).into(rec.prov)
    return _Harness(dict(models), references)


@dataclass(frozen=True)
class BuildProvenance:
    """The builds' part of the Provenance: each side's engine identity (tree, lock, interpreter)."""

    engine_build: dict[str, Any]

    def into(self, p: Provenance) -> Provenance:
        return dataclasses.replace(p, engine_build=self.engine_build)


def _engine_builds(ctx: RunContext) -> BuildProvenance:
    return BuildProvenance(
        {s.value: builds.engine_identity(x.worktree, x.build) for s, x in ctx.sides.items()}
    )


def _check_drift(ctx: RunContext) -> None:
    """The harness, as the head's venv will import it, must be main's byte for byte: packaging
    (pyproject.toml, setup.py, package data, a .pth file) can put other bytes in place of a file the PR
    never touched; such a PR is never run."""
    modules = ctx.ws.rules.harness_modules
    if not modules:
        return
    try:
        venvs = [ctx.sides[s].build.venv for s in (Side.BASE, Side.HEAD)]
        drift = harness_drift(
            *(harness_fingerprint(v, modules, ctx.ws.python) for v in venvs if v is not None)
        )
    except checkout.BuildError as exc:
        raise _Stop(Failure(Side.HARNESS, "harness", str(exc))) from exc
    if drift:
        raise _Stop(skipped="the built PR does not import main's harness, so the bot never runs it: "
                    + "; ".join(drift[:5]))  # fmt: skip


@dataclass
class _Results:
    """The A/B pairs, the audits and the gates of every model, and what stopped them (if anything)."""

    throughput: list[ThroughputPairs] = dataclasses.field(default_factory=list)
    accuracy: list[AccuracyResult] = dataclasses.field(default_factory=list)
    spec: list[SpecResult] = dataclasses.field(default_factory=list)
    audits: list[DecodeAudit] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    failures: list[Failure] = dataclasses.field(default_factory=list)

    def fields(self) -> dict[str, Any]:
        return {"throughput": tuple(self.throughput), "accuracy": tuple(self.accuracy), "spec": tuple(self.spec),
                "audits": tuple(self.audits), "diagnostics": tuple(self.notes),
                "failures": tuple(self.failures)}  # fmt: skip


def _measure(ctx: RunContext, harness: _Harness, corpus: Path, seed: int) -> _Results:
    """The A/B pairs per model (warm serving processes, the harness's clock, a quiet box), then the
    audit and the gates; a side's failure or a busy box ends them, keeping what was measured."""
    out = _Results()
    try:
        target = ctx.ws.rules.spec_pair.target.name
        if (
            ctx.req.options.spec
            and ctx.req.options.spec_drafter == "draft"
            and target not in {m.name for m in ctx.req.profile.models}
        ):
            raise SideFailed(Failure(Side.HARNESS, "harness", f"--spec-drafter draft drafts for models.yaml's spec "
                                     f"target {target}, which profile {ctx.req.profile.name} does not measure"))  # fmt: skip
        if drafts(ctx) and not ctx.ws.rules.engine.draft_args:
            raise SideFailed(Failure(Side.HARNESS, "harness", "the spec runs draft with a draft model, and "
                                     "engine.yaml's serve.draft does not say how the engine is given one"))  # fmt: skip
        for ref in ctx.req.profile.models:
            registry = ref.has_weights  # a model file: its own tokenizer's prompts, the reference
            engine = ctx.ws.rules.engine  # how the contest's engine takes its model (engine.yaml)
            args = (
                engine.model_args(model=str(harness.models[ref.name]))
                if registry
                else engine.model_args(shape=ref.name)
            )
            if drafter_for(ctx, ctx.req.profile.name, ref.name) == "draft" and drafts(ctx):
                # the target's serving engine loads the draft model its spec requests draft with
                args = [
                    *args,
                    *engine.draft_model_args(str(harness.models[ctx.ws.rules.spec_pair.draft.name])),
                ]
            # scored where a decode track scores this model (tracks.yaml); a guard is measured, never scored
            profile = ctx.ws.rules.model_profile(ctx.req.profile, ref.name)
            got = measure_model(ctx, profile, ref.name, args, corpus, seed, registry,
                                reference=harness.references.get(ref.name))  # fmt: skip
            out.throughput += got.throughput
            out.audits += got.audits
            out.spec += got.spec
            out.notes += got.notes
            if got.accuracy is not None:
                out.accuracy.append(got.accuracy)
    except SideFailed as exc:
        out.failures.append(exc.failure)
    except box.BoxBusy as exc:
        out.failures.append(Failure(Side.HARNESS, "box", str(exc)))
    return out


# what other modules use from here (Workspace, Log and SideFailed live in context.py)
__all__ = ["Log", "SideFailed", "Workspace", "evaluate", "request", "unresolved"]
