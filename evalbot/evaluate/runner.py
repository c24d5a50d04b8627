"""The main job: build base and head from source, run them sandboxed and interleaved, return Measurements.

Trust: the harness (this bot, the rules, the prompt corpus, the reference) comes from the trusted
side; a head touching a sensitive path is SKIPPED before anything of it runs. Engine processes are
fresh for every run, alternate base/head (ABBA, so in-pair drift cancels too), run under bubblewrap
with a scrubbed environment, and every line they write is checked against the serving protocol
(`served`) before a number is believed; the harness's own clock times them. Who failed
decides the outcome class: the head alone (REJECT) or the base/box too (INFRA_ERROR).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalbot import verdict
from evalbot.evaluate import (
    abtest,
    audit,
    box,
    builds,
    checkout,
    compile_cache,
    cpumeter,
    prompts,
    sandbox,
    served,
)
from evalbot.evaluate.context import (
    SIDE_LABEL,
    EvalConfig,
    Log,
    RunContext,
    SideBuild,
    SideFailed,
    confine_build,
    ro_binds,
    sandbox_spec,
)
from evalbot.evaluate.harness import harness_drift, harness_fingerprint
from evalbot.evaluate.reference import accuracy_served, audit_answers, fetch_models, llama_reference, sha_of
from evalbot.evaluate.speculative import spec_served
from evalbot.model import (
    AccuracyResult,
    DecodeAudit,
    Failure,
    Measurements,
    Provenance,
    Side,
    SpecResult,
    ThroughputPairs,
)
from evalbot.policy.sensitive_paths import harness_hits
from evalbot.rules import Profile


def evaluate(cfg: EvalConfig, log: Log) -> Measurements:
    """Run the whole evaluation; every failure ends up in Measurements.failures, never as an exception.

    The harness's own steps come first and fail fast with their cause: main's build, the models, and
    the llama.cpp reference (computed or loaded from its cache). Only then is the PR built, and only on
    a quiet box are the A/B pairs run. The PR's checkout is removed afterwards (main's is kept for the
    next evaluation; the builds' venvs are cached by tree, not by checkout).
    """
    m = _evaluate(cfg, log)
    p = m.provenance
    if p.measured_sha and p.measured_sha != p.base_sha:
        try:
            checkout.remove_worktree(cfg.work_root.resolve() / "worktrees", p.measured_sha)
        except (OSError, ValueError) as exc:  # disk housekeeping never costs a verdict
            log(f"could not remove the PR's checkout {p.measured_sha[:12]}: {exc}")
    return m


def _evaluate(cfg: EvalConfig, log: Log) -> Measurements:
    started = box.now()
    cfg = dataclasses.replace(
        cfg, work_root=cfg.work_root.resolve(), repo=cfg.repo.resolve()
    )  # run from anywhere
    profile = cfg.rules.profile(cfg.profile)
    seed = cfg.seed if cfg.seed is not None else prompts.fresh_seed()
    corpus = prompts.default_corpus_dir()
    prov = Provenance(
        repo=str(cfg.repo),
        base_sha="",
        head_sha="",
        harness_sha="",
        rules_hash=cfg.rules.rules_hash,
        profile=cfg.profile,
        prompt_seed=seed,
        corpus_sha256=prompts.corpus_sha256(corpus),
        started_at=started,
        pr=cfg.pr,
        title=cfg.title,
        author=cfg.author,
        branch=cfg.branch,
        box=box.identity(),
    )
    reproduce = (
        f"evalbot evaluate --repo {cfg.repo} --base {cfg.base} --head {cfg.head} --profile {cfg.profile} "
        f"--seed {seed}"
        + ("" if cfg.spec else " --no-spec")
        + (f" --max-pairs {cfg.max_pairs}" if cfg.max_pairs else "")
    )
    samples: list[dict[str, Any]] = []

    def done(**kw: Any) -> Measurements:
        p = dataclasses.replace(prov, finished_at=box.now(), **kw.pop("prov", {}))
        return Measurements(provenance=p, reproduce=reproduce, box_samples=tuple(samples), **kw)

    cfg.work_root.mkdir(parents=True, exist_ok=True)
    # what is measured is what would merge: the head merged into main (the head itself when it holds main)
    try:
        base_sha, _ = checkout.resolve(cfg.repo, cfg.base)
        head_sha, _ = checkout.resolve(cfg.repo, cfg.head)
        measured = checkout.merge_commit(cfg.repo, base_sha, head_sha)
        shas: dict[str, Any] = {
            "base_sha": base_sha,
            "head_sha": head_sha,
            "measured_sha": measured or "",
            "harness_sha": base_sha,
        }
        if measured is None:
            return done(
                prov=shas, skipped_reason=f"the PR conflicts with main {base_sha[:12]}: rebase it and push"
            )
        base_wt = checkout.prepare_worktree(cfg.repo, base_sha, cfg.work_root / "worktrees")
        head_wt = checkout.prepare_worktree(cfg.repo, measured, cfg.work_root / "worktrees")
    except checkout.BuildError as exc:
        return done(failures=(Failure(Side.HARNESS, "git", str(exc)),))
    hits = harness_hits(checkout.changed_paths(cfg.repo, base_sha, head_sha), cfg.rules)
    if hits:
        # names come from git with surrogateescape: show undecodable bytes as U+FFFD, never crash on them
        shown = ", ".join(h.encode("utf-8", "surrogateescape").decode("utf-8", "replace") for h in hits[:8])
        shown += " …" if len(hits) > 8 else ""
        return done(
            prov=shas, skipped_reason=f"the PR changes sensitive paths, which the bot never runs: {shown}"
        )
    if not cfg.no_sandbox and not sandbox.sandbox_available():
        return done(
            prov=shas,
            failures=(
                Failure(
                    Side.HARNESS,
                    "sandbox",
                    "bubblewrap is not available; refusing to run untrusted code (pass --no-sandbox to override)",
                ),
            ),
        )

    with tempfile.TemporaryDirectory(prefix="evalbot-run-") as tmp:
        ctx = RunContext(
            cfg,
            log,
            Path(tmp),
            profile_device=profile.device,
            engine_threads=profile.measurement.threads,
            run_timeout_s=profile.measurement.run_timeout_s,
            max_output_bytes=profile.measurement.max_output_mb << 20,
        )
        ctx.box_samples = samples
        # 1. the harness: main's build, the models and the reference, each failing fast with its cause
        failure = _build_side(ctx, Side.BASE, base_wt)
        if failure:
            return done(prov=shas, failures=(failure,))
        try:
            models = fetch_models(ctx, profile)
        except SideFailed as exc:
            return done(prov=shas, failures=(exc.failure,))
        ctx.ro_binds = ro_binds([p.parent for p in models.values()])
        ctx.model_paths = dict(models)
        draws = prompts.draw(corpus, seed, n_chars=8 * max(c.ctx for c in profile.contexts) + 4000, k=2)
        prompt_files = prompts.write_prompt_files(draws, ctx.scratch / "prompts")
        model_shas = {name: sha_of(ctx, path) for name, path in models.items()}
        shas |= {"model_sha256s": model_shas}
        references: dict[str, Path] = {}
        identities: dict[str, Any] = {}
        if cfg.accuracy:
            try:
                for ref in profile.models:
                    if ref.source == "registry":
                        references[ref.name], identities[ref.name] = llama_reference(
                            ctx, models[ref.name], prompt_files[1]
                        )
            except SideFailed as exc:
                return done(prov=shas | {"reference": identities}, failures=(exc.failure,))
        shas |= {"reference": identities}
        # 2. the PR's build
        failure = _build_side(ctx, Side.HEAD, head_wt)
        engine_build = {s.value: builds.engine_identity(x.worktree, x.build) for s, x in ctx.sides.items()}
        shas |= {"engine_build": engine_build}
        if failure:
            return done(prov=shas, failures=(failure,))
        # the harness, as the head's venv will import it, must be main's byte for byte: packaging
        # (pyproject.toml, setup.py, package data, a .pth file) can put other bytes in place of a file
        # the PR never touched
        modules = cfg.rules.policy.harness_modules
        if modules:
            try:
                drift = harness_drift(
                    *(
                        harness_fingerprint(ctx.sides[s].build.venv, modules, cfg.python)  # type: ignore[arg-type]
                        for s in (Side.BASE, Side.HEAD)
                    )
                )
            except checkout.BuildError as exc:
                return done(prov=shas, failures=(Failure(Side.HARNESS, "harness", str(exc)),))
            if drift:
                return done(
                    prov=shas,
                    skipped_reason="the built PR does not import main's harness, so the bot "
                    "never runs it: " + "; ".join(drift[:5]),
                )
        # 3. the A/B pairs (warm serving processes, the harness's clock, a quiet box), the audit, the gates
        throughput: list[ThroughputPairs] = []
        accuracy: list[AccuracyResult] = []
        spec_results: list[SpecResult] = []
        audits: list[DecodeAudit] = []
        notes: list[str] = []
        failures: list[Failure] = []
        try:
            for ref in profile.models:
                registry = ref.source == "registry"
                model_args = (
                    ["--model", str(models[ref.name])]
                    if registry
                    else ["--random-weights", "--shape", ref.name]
                )
                served_model = _measure_served(
                    ctx,
                    profile,
                    ref.name,
                    model_args,
                    corpus,
                    seed,
                    registry,
                    reference=references.get(ref.name) if registry and cfg.accuracy else None,
                )
                throughput += served_model.throughput
                audits += served_model.audits
                spec_results += served_model.spec
                notes += served_model.notes
                if served_model.accuracy is not None:
                    accuracy.append(served_model.accuracy)
        except SideFailed as exc:
            failures.append(exc.failure)
        except box.BoxBusy as exc:
            failures.append(Failure(Side.HARNESS, "box", str(exc)))
        return done(
            prov=shas,
            throughput=tuple(throughput),
            accuracy=tuple(accuracy),
            spec=tuple(spec_results),
            audits=tuple(audits),
            diagnostics=tuple(notes),
            failures=tuple(failures),
        )


def _build_side(ctx: RunContext, side: Side, wt: checkout.Worktree) -> Failure | None:
    """Build one revision into its venv; the Failure to record when it does not build."""
    ctx.log(f"building {side.value} {wt.sha[:12]}")
    b = builds.build_env(
        wt,
        ctx.cfg.work_root / "venvs",
        python=ctx.cfg.python,
        log_dir=ctx.cfg.work_root / "logs",
        timeout_s=1800,
        confine=None if ctx.cfg.no_sandbox else confine_build,
    )
    ctx.sides[side] = SideBuild(side, wt, b)
    if b.ok:
        return None
    return Failure(side, b.failure_stage or "build", b.message, b.log_tail)


# --- engine runs ----------------------------------------------------------------------------------


@dataclass
class _Served:
    """What the served measurement of one model produced."""

    throughput: list[ThroughputPairs]
    audits: list[DecodeAudit]
    spec: list[SpecResult]
    notes: list[str]
    accuracy: AccuracyResult | None = None


def serve_dirs(ctx: RunContext, side: Side) -> tuple[Path, Path]:
    """A serving process's scratch and its side's root, emptied for it: the root holds only the side's
    compile caches, a fresh copy of its first process's compile where one was kept (`compile_cache`), and
    the scratch. Every process of a side sees the same paths and nothing an earlier one wrote."""
    root = ctx.scratch / "serve" / side.value
    if root.exists():
        compile_cache.remove(root)
    compile_cache.restore(ctx.compiled.get(side), root / "caches")
    scratch = root / "work"
    scratch.mkdir()
    return scratch, root


def keep_compiles(ctx: RunContext, procs: dict[Side, served.ServedProcess]) -> None:
    """Once per side, while its first serving process is frozen after its warm-up and before any timed
    request: keep a copy of that process's compile caches for the side's later processes."""
    for side in procs:
        if side in ctx.compiled or side in ctx.compile_notes:
            continue
        dest = ctx.scratch / "serve" / f"{side.value}.compiled"
        why = compile_cache.snapshot(ctx.scratch / "serve" / side.value / "caches", dest)
        if why is None:
            ctx.compiled[side] = dest
        else:
            ctx.compile_notes[side] = why
            ctx.log(f"{SIDE_LABEL[side]}'s compile is not kept ({why}): each of its processes compiles anew")


def _launcher(ctx: RunContext, model_args: list[str], max_seq: int, warmup: int) -> abtest.Launch:
    """Start one side's `engine serve`, sandboxed, in its emptied side folder (with a copy of the side's
    first compile, once kept), with the profile's device."""

    def launch(side: Side) -> served.ServedProcess:
        venv = ctx.sides[side].build.venv
        assert venv is not None
        scratch, root = serve_dirs(ctx, side)
        ctx.serve_scratch[side] = scratch
        spec = sandbox_spec(
            ctx,
            venv,
            scratch,
            [ctx.scratch / "prompts"],
            ctx.cfg.rules.profile(ctx.cfg.profile).measurement.time_budget_s + ctx.run_timeout_s,
            side_root=root,
        )
        argv = [
            str(venv / "bin" / "python"),
            "-m",
            "engine",
            "serve",
            *model_args,
            "--max-seq",
            str(max_seq),
            "--device",
            ctx.profile_device,
            "--warmup",
            str(max(1, warmup)),
        ]
        meter = cpumeter.make_meter(side.value)
        threads = ctx.cfg.rules.profile(ctx.cfg.profile).measurement.threads
        if threads:  # the kernel holds the tree to its cores (with the checks' slack), where the box lets it
            meter.cap(threads * abtest.REQUEST_CPU_SLACK)
        return served.ServedProcess.start(
            SIDE_LABEL[side], spec, argv, no_sandbox=ctx.cfg.no_sandbox, meter=meter
        )

    return launch


def _measure_served(
    ctx: RunContext,
    profile: Profile,
    name: str,
    model_args: list[str],
    corpus: Path,
    seed: int,
    registry: bool,
    reference: Path | None = None,
) -> _Served:
    """A/B pairs in blocks of warm serving processes, then the decode audit and speculative decoding, all on
    the harness's clock; each side's failure is the side's (main's: an infra error)."""
    m = profile.measurement
    block = ctx.cfg.rules.spec_pair.block
    max_seq = max(c.ctx for c in profile.contexts) + m.decode_tokens + block + 8
    launch = _launcher(ctx, model_args, max_seq, m.warmup_runs)
    texts = prompts.load_corpus(corpus)
    procs: dict[Side, served.ServedProcess] = {}

    def tokenized(ctx_len: int, serial: int) -> list[int]:
        text = prompts.draw_from(texts, (seed * 1_000_003 + serial) % 2**53, 8 * ctx_len + 64, 1)[0].text
        main = procs[Side.BASE]
        got = served.run_alone(
            main,
            [p for s, p in procs.items() if s is not Side.BASE],
            lambda: main.request({"op": "tokenize", "text": text, "max_tokens": ctx_len}, ctx.run_timeout_s),
        )
        ids = list(got.summary.get("ids") or [])
        if len(ids) < ctx_len or not all(isinstance(t, int) and 0 <= t < main.vocab for t in ids):
            raise SideFailed(
                Failure(
                    Side.BASE,
                    "serve",
                    f"main's tokenizer gave {len(ids)} valid ids for a prompt of {ctx_len} tokens",
                )
            )
        return ids[:ctx_len]

    def launch_tracked(side: Side) -> served.ServedProcess:
        procs[side] = launch(side)
        return procs[side]

    source = tokenized if registry else None
    pool = abtest.Prompts(source or (lambda c, i: abtest.random_prompts(procs[Side.BASE].vocab, seed)(c, i)))
    try:
        cpumeter.sweep_stale()
        run, procs = abtest.measure(
            profile,
            launch_tracked,
            pool,
            ctx.log,
            max_pairs=ctx.cfg.max_pairs,
            request_timeout_s=ctx.run_timeout_s,
            ready_timeout_s=ctx.run_timeout_s,
            progress=ctx.cfg.progress,
            decided=lambda samples: verdict.no_pair_could_change(
                abtest.throughput(samples, profile, name), ctx.cfg.rules
            ),
            settled=lambda ready: keep_compiles(ctx, ready),
        )
        ctx.box_samples.extend(run.box_samples)
        gate = ctx.cfg.rules.gates.decode_audit
        chosen = audit.choose(run.samples, share=gate.share, minimum=gate.min_requests)
        answers, judge_name = audit_answers(ctx, chosen, procs, registry, name)
        audits = audit.judge(name, judge_name, chosen, answers, gate.near_tie)
        spec: list[SpecResult] = []
        tau_notes: list[str] = []
        if ctx.cfg.spec and ctx.cfg.rules.spec_pair.profile == ctx.cfg.profile:
            spec, tau_notes = spec_served(ctx, profile, name, procs, run, block, pool)
        accuracy = accuracy_served(ctx, name, procs, reference) if reference is not None else None
        return _Served(
            abtest.throughput(run.samples, profile, name),
            audits,
            spec,
            [
                *_diagnostics(run.samples, ctx.cfg.rules.gates.timing.max_self_report_gap),
                *_freeze_notes(procs.values(), profile.measurement.threads),
                *_clock_notes(run),
                *tau_notes,
            ],
            accuracy,
        )
    except abtest.SideError as exc:
        raise SideFailed(Failure(exc.side, exc.stage, str(exc), exc.tail)) from exc
    except served.ServeError as exc:  # main's process, serving the harness (tokenizing, auditing)
        raise SideFailed(Failure(Side.BASE, exc.stage, str(exc), exc.tail)) from exc
    finally:
        for p in procs.values():
            p.close()


def _freeze_notes(procs: Iterable[served.ServedProcess], threads: int | None) -> list[str]:
    """The weaker modes, said where they were used: a box that gives no cgroup v2 freezer, or none that
    can cap an engine's CPU."""
    procs = list(procs)
    notes = []
    if not all(p.freeze_mode == served.FREEZER for p in procs):
        notes.append(
            "this box gives the harness no cgroup v2 freezer, so the idle side was frozen by SIGSTOP to each "
            "of its processes, which a process can arrange to undo; the CPU each side used while frozen and "
            "any line it wrote then were still checked, and neither was seen"
        )
    if threads and not all(p.meter is not None and p.meter.cap_cores for p in procs):
        notes.append(
            f"this box lets the harness cap no cgroup's CPU, so the {threads} thread"
            f"{'s' if threads != 1 else ''} the profile gives each engine were checked request by request "
            "(prefill and decode), not enforced by the kernel"
        )
    return notes


def _clock_notes(run: abtest.Run) -> list[str]:
    """The one-part clock, said where it was used: main's engine answers no 'prefill' op."""
    if run.two_part is not False:
        return []
    return [
        "main's engine answers no 'prefill' op, so each request was timed in one part: decode from the "
        "first token line to the last, and an engine could have computed decode steps before its first "
        "token, where only the prefill guard sees them (an engine that lists 'prefill' in its ready line "
        "is timed from a continuation the harness draws after the prefill)"
    ]


def _diagnostics(samples: list[abtest.Sample], max_gap: float) -> list[str]:
    """What the harness noticed that decides nothing: engines whose own clocks disagree with it."""
    notes = []
    for side in (Side.BASE, Side.HEAD):
        gaps = sorted(g for s in samples if s.side is side and (g := s.self_report_gap) is not None)
        if gaps and gaps[len(gaps) // 2] > max_gap:
            notes.append(
                f"{SIDE_LABEL[side]}'s engine reports decode times {gaps[len(gaps) // 2]:.0%} away from the "
                f"harness's clock (median over {len(gaps)} requests); only the harness's times count"
            )
        wrong_n = sum(1 for s in samples if s.side is side and s.reported_n not in (None, len(s.tokens)))
        if wrong_n:
            notes.append(
                f"{SIDE_LABEL[side]}'s engine reported a token count other than it streamed in {wrong_n} "
                "requests; only the streamed tokens count"
            )
    return notes


# what other modules use from here (EvalConfig, Log and SideFailed live in context.py)
__all__ = ["EvalConfig", "Log", "SideFailed", "evaluate"]
