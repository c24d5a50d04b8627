"""The main job: build base and head from source, run them sandboxed and interleaved, return Measurements.

Trust: the harness (this bot, the rules, the prompt corpus, the reference) comes from the trusted
side; a head touching a sensitive path is SKIPPED before anything of it runs. Engine processes are
fresh for every run, alternate base/head (ABBA, so in-pair drift cancels too), run under bubblewrap
with a scrubbed environment, and their JSON is validated before a number is believed. Who failed
decides the outcome class: the head alone (REJECT) or the base/box too (INFRA_ERROR).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalbot.evaluate import abtest, audit, box, builds, checkout, prompts, sandbox, served
from evalbot.evaluate.exits import describe_exit
from evalbot.evaluate.harness import harness_drift, harness_fingerprint
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
from evalbot.rules import Profile, Quiet, Rules

Log = Callable[[str], None]


class SideFailed(Exception):
    """One engine run failed; carries the Failure to record."""

    def __init__(self, failure: Failure):
        super().__init__(failure.message)
        self.failure = failure


@dataclass(frozen=True)
class EvalConfig:
    """What to evaluate and how (everything the CLI parsed)."""

    repo: Path
    base: str
    head: str
    rules: Rules
    profile: str
    work_root: Path
    no_sandbox: bool = False
    seed: int | None = None
    spec: bool = True
    spec_drafter: str = "ngram"  # "ngram" (fast, the profile's model) or "draft" (the rules' target/draft pair)
    accuracy: bool = True
    max_pairs: int | None = None  # overrides the profile's, e.g. for a quick demo
    positions: int = 128
    pr: int | None = None
    title: str = ""
    author: str = ""
    branch: str = ""
    python: str = sys.executable
    # structured progress (stage, pairs per context, running ratio and CI, ETA) for a live display
    progress: Callable[[dict[str, Any]], None] | None = None


@dataclass
class _Side:
    side: Side
    worktree: checkout.Worktree
    build: builds.BuildResult


@dataclass
class _Ctx:
    cfg: EvalConfig
    log: Log
    scratch: Path
    ro_binds: list[Path] = field(default_factory=list)
    sides: dict[Side, _Side] = field(default_factory=dict)
    profile_device: str = "cpu"
    run_timeout_s: float = 600.0
    max_output_bytes: int = 64 << 20
    box_samples: list[dict[str, Any]] = field(default_factory=list)
    runs: int = 0  # engine processes started, for fresh scratch names
    quiet: Quiet = field(default_factory=Quiet)
    model_paths: dict[str, Path] = field(default_factory=dict)
    serve_scratch: dict[Side, Path] = field(default_factory=dict)  # each side's latest serving process's


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
    cfg = dataclasses.replace(cfg, work_root=cfg.work_root.resolve(), repo=cfg.repo.resolve())  # run from anywhere
    profile = cfg.rules.profile(cfg.profile)
    seed = cfg.seed if cfg.seed is not None else prompts.fresh_seed()
    corpus = prompts.default_corpus_dir()
    prov = Provenance(repo=str(cfg.repo), base_sha="", head_sha="", harness_sha="", rules_hash=cfg.rules.rules_hash,
                      profile=cfg.profile, prompt_seed=seed, corpus_sha256=prompts.corpus_sha256(corpus),
                      started_at=started, pr=cfg.pr, title=cfg.title, author=cfg.author, branch=cfg.branch,
                      box=box.identity())
    reproduce = (f"evalbot evaluate --repo {cfg.repo} --base {cfg.base} --head {cfg.head} --profile {cfg.profile} "
                 f"--seed {seed}" + ("" if cfg.spec else " --no-spec") +
                 (f" --max-pairs {cfg.max_pairs}" if cfg.max_pairs else ""))
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
        shas: dict[str, Any] = {"base_sha": base_sha, "head_sha": head_sha, "measured_sha": measured or "",
                                "harness_sha": base_sha}
        if measured is None:
            return done(prov=shas, skipped_reason=f"the PR conflicts with main {base_sha[:12]}: rebase it and push")
        base_wt = checkout.prepare_worktree(cfg.repo, base_sha, cfg.work_root / "worktrees")
        head_wt = checkout.prepare_worktree(cfg.repo, measured, cfg.work_root / "worktrees")
    except checkout.BuildError as exc:
        return done(failures=(Failure(Side.HARNESS, "git", str(exc)),))
    hits = harness_hits(checkout.changed_paths(cfg.repo, base_sha, head_sha), cfg.rules)
    if hits:
        # names come from git with surrogateescape: show undecodable bytes as U+FFFD, never crash on them
        shown = ", ".join(h.encode("utf-8", "surrogateescape").decode("utf-8", "replace") for h in hits[:8])
        shown += " …" if len(hits) > 8 else ""
        return done(prov=shas, skipped_reason=f"the PR changes sensitive paths, which the bot never runs: {shown}")
    if not cfg.no_sandbox and not sandbox.sandbox_available():
        return done(prov=shas, failures=(Failure(Side.HARNESS, "sandbox",
                    "bubblewrap is not available; refusing to run untrusted code (pass --no-sandbox to override)"),))

    with tempfile.TemporaryDirectory(prefix="evalbot-run-") as tmp:
        ctx = _Ctx(cfg, log, Path(tmp), profile_device=profile.device,
                   run_timeout_s=profile.measurement.run_timeout_s,
                   max_output_bytes=profile.measurement.max_output_mb << 20, quiet=profile.quiet)
        ctx.box_samples = samples
        # 1. the harness: main's build, the models and the reference, each failing fast with its cause
        failure = _build_side(ctx, Side.BASE, base_wt)
        if failure:
            return done(prov=shas, failures=(failure,))
        try:
            models = _fetch_models(ctx, profile)
        except SideFailed as exc:
            return done(prov=shas, failures=(exc.failure,))
        ctx.ro_binds = _ro_binds([p.parent for p in models.values()])
        ctx.model_paths = dict(models)
        draws = prompts.draw(corpus, seed, n_chars=8 * max(c.ctx for c in profile.contexts) + 4000, k=2)
        prompt_files = prompts.write_prompt_files(draws, ctx.scratch / "prompts")
        model_shas = {name: _sha_of(ctx, path) for name, path in models.items()}
        shas |= {"model_sha256s": model_shas}
        references: dict[str, Path] = {}
        identities: dict[str, Any] = {}
        if cfg.accuracy:
            try:
                for ref in profile.models:
                    if ref.source == "registry":
                        references[ref.name], identities[ref.name] = _reference(ctx, models[ref.name],
                                                                                 prompt_files[1])
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
                drift = harness_drift(*(harness_fingerprint(ctx.sides[s].build.venv, modules)  # type: ignore[arg-type]
                                        for s in (Side.BASE, Side.HEAD)))
            except checkout.BuildError as exc:
                return done(prov=shas, failures=(Failure(Side.HARNESS, "harness", str(exc)),))
            if drift:
                return done(prov=shas, skipped_reason="the built PR does not import main's harness, so the bot "
                            "never runs it: " + "; ".join(drift[:5]))
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
                model_args = ["--model", str(models[ref.name])] if registry else ["--random-weights", "--shape",
                                                                                  ref.name]
                measured = _measure_served(ctx, profile, ref.name, model_args, corpus, seed, registry,
                                           reference=references.get(ref.name) if registry and cfg.accuracy else None)
                throughput += measured.throughput
                audits += measured.audits
                spec_results += measured.spec
                notes += measured.notes
                if measured.accuracy is not None:
                    accuracy.append(measured.accuracy)
        except SideFailed as exc:
            failures.append(exc.failure)
        except box.BoxBusy as exc:
            failures.append(Failure(Side.HARNESS, "box", str(exc)))
        return done(prov=shas, throughput=tuple(throughput), accuracy=tuple(accuracy), spec=tuple(spec_results),
                    audits=tuple(audits), diagnostics=tuple(notes), failures=tuple(failures))


def _build_side(ctx: _Ctx, side: Side, wt: checkout.Worktree) -> Failure | None:
    """Build one revision into its venv; the Failure to record when it does not build."""
    ctx.log(f"building {side.value} {wt.sha[:12]}")
    b = builds.build_env(wt, ctx.cfg.work_root / "venvs", python=ctx.cfg.python, log_dir=ctx.cfg.work_root / "logs",
                         timeout_s=1800, confine=None if ctx.cfg.no_sandbox else _confine_build)
    ctx.sides[side] = _Side(side, wt, b)
    if b.ok:
        return None
    return Failure(side, b.failure_stage or "build", b.message, b.log_tail)


# --- engine runs ----------------------------------------------------------------------------------


def _fresh_scratch(ctx: _Ctx, label: str) -> Path:
    ctx.runs += 1
    path = ctx.scratch / "runs" / f"{ctx.runs:05d}-{label}"
    path.mkdir(parents=True)
    return path


@dataclass
class _Served:
    """What the served measurement of one model produced."""

    throughput: list[ThroughputPairs]
    audits: list[DecodeAudit]
    spec: list[SpecResult]
    notes: list[str]
    accuracy: AccuracyResult | None = None


SIDE_LABEL = {Side.BASE: "main", Side.HEAD: "the PR"}


def _launcher(ctx: _Ctx, model_args: list[str], max_seq: int, warmup: int) -> abtest.Launch:
    """Start one side's `engine serve`, sandboxed, in a fresh scratch dir, with the profile's device."""

    def launch(side: Side) -> served.ServedProcess:
        venv = ctx.sides[side].build.venv
        assert venv is not None
        scratch = _fresh_scratch(ctx, f"{side.value}-serve")
        ctx.serve_scratch[side] = scratch
        spec = _sandbox_spec(ctx, venv, scratch, [ctx.scratch / "prompts"], ctx.cfg.rules.profile(ctx.cfg.profile)
                             .measurement.time_budget_s + ctx.run_timeout_s)
        argv = [str(venv / "bin" / "python"), "-m", "engine", "serve", *model_args, "--max-seq", str(max_seq),
                "--device", ctx.profile_device, "--warmup", str(max(1, warmup))]
        return served.ServedProcess.start(SIDE_LABEL[side], spec, argv, no_sandbox=ctx.cfg.no_sandbox)

    return launch


def _measure_served(ctx: _Ctx, profile: Profile, name: str, model_args: list[str], corpus: Path, seed: int,
                    registry: bool, reference: Path | None = None, accuracy_text: Path | None = None) -> _Served:
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
        got = served.run_alone(main, [p for s, p in procs.items() if s is not Side.BASE], lambda: main.request(
            {"op": "tokenize", "text": text, "max_tokens": ctx_len}, ctx.run_timeout_s))
        ids = list(got.summary.get("ids") or [])
        if len(ids) < ctx_len or not all(isinstance(t, int) and 0 <= t < main.vocab for t in ids):
            raise SideFailed(Failure(Side.BASE, "serve", f"main's tokenizer gave {len(ids)} valid ids for a prompt "
                                     f"of {ctx_len} tokens"))
        return ids[:ctx_len]

    def launch_tracked(side: Side) -> served.ServedProcess:
        procs[side] = launch(side)
        return procs[side]

    source = tokenized if registry else None
    pool = abtest.Prompts(source or (lambda c, i: abtest.random_prompts(procs[Side.BASE].vocab, seed)(c, i)))
    try:
        run, procs = abtest.measure(profile, launch_tracked, pool, ctx.log, max_pairs=ctx.cfg.max_pairs,
                                    request_timeout_s=ctx.run_timeout_s, ready_timeout_s=ctx.run_timeout_s,
                                    progress=ctx.cfg.progress)
        ctx.box_samples.extend(run.box_samples)
        gate = ctx.cfg.rules.gates.decode_audit
        chosen = audit.choose(run.samples, share=gate.share, minimum=gate.min_requests)
        answers, judge_name = _audit_answers(ctx, chosen, procs, registry, name)
        audits = audit.judge(name, judge_name, chosen, answers, gate.near_tie)
        spec, tau_notes = [], []
        if ctx.cfg.spec and ctx.cfg.rules.spec_pair.profile == ctx.cfg.profile:
            spec, tau_notes = _spec_served(ctx, profile, name, procs, run, block, pool)
        accuracy = _accuracy_served(ctx, name, procs, reference) if reference is not None else None
        return _Served(abtest.throughput(run.samples, profile, name), audits, spec,
                       [*_diagnostics(run.samples, ctx.cfg.rules.gates.timing.max_self_report_gap), *tau_notes],
                       accuracy)
    except abtest.SideError as exc:
        raise SideFailed(Failure(exc.side, exc.stage, str(exc), exc.tail)) from exc
    except served.ServeError as exc:  # main's process, serving the harness (tokenizing, auditing)
        raise SideFailed(Failure(Side.BASE, exc.stage, str(exc), exc.tail)) from exc
    finally:
        for p in procs.values():
            p.close()


def _audit_answers(ctx: _Ctx, chosen: list[abtest.Sample], procs: dict[Side, served.ServedProcess],
                   registry: bool, name: str) -> tuple[dict[str, dict[str, Any]], str]:
    """The reference's argmax and margins for each audited request: llama.cpp on the model file, or main's
    own serving engine where the weights are random (teacher-forced on the side's tokens either way)."""
    if not chosen:
        return {}, "none"
    if registry:
        venv = ctx.sides[Side.BASE].build.venv
        assert venv is not None
        folder = ctx.scratch / "audit"
        folder.mkdir(exist_ok=True)
        requests, answers = folder / "requests.jsonl", folder / "answers.jsonl"
        requests.write_text(audit.requests_file(chosen))
        model = ctx.model_paths[name]
        ctx.log(f"{name}: auditing {len(chosen)} timed requests against the reference")
        res = sandbox.run_trusted([str(venv / "bin" / "python"), "-I", "-m", "engine.reference", "audit", "--model",
                                   str(model), "--requests", str(requests), "--out", str(answers)],
                                  timeout_s=REFERENCE_TIMEOUT_S, cwd=folder, max_output_bytes=1 << 20)
        if not res.ok:
            raise SideFailed(Failure(Side.HARNESS, "reference", "the reference's audit "
                                     + describe_exit(res.returncode, timed_out=res.timed_out,
                                                     timeout_s=REFERENCE_TIMEOUT_S), _tail(res.stderr)))
        out = {}
        for line in answers.read_text().splitlines():
            item = json.loads(line)
            out[item["key"]] = item
        try:
            engine = json.loads(res.stdout.strip().splitlines()[-1]).get("engine") or "reference"
        except (ValueError, IndexError, AttributeError):
            engine = "reference"
        return out, str(engine)
    main = procs[Side.BASE]
    head = [p for s, p in procs.items() if s is not Side.BASE]
    out = {}
    for s in chosen:
        req = {"op": "score", "ids": [*s.prompt, *s.tokens], "from": len(s.prompt)}
        got = served.run_alone(main, head, lambda req=req: main.request(req, ctx.run_timeout_s))
        out[audit.key(s)] = got.summary
    return out, "main"


def _plain_pair(ctx: _Ctx, procs: dict[Side, served.ServedProcess], pool: abtest.Prompts, length: int,
                gen: int) -> dict[Side, abtest.Sample]:
    """Both sides' plain decode of one fresh prompt, as the reference for a speculative run."""
    prompt = pool.next(length)
    out = {}
    for side, p in procs.items():
        others = [q for s, q in procs.items() if s is not side]
        try:
            t = served.run_alone(p, others, lambda p=p: p.request(
                {"op": "generate", "prompt_ids": prompt, "max_new": gen}, ctx.run_timeout_s))
        except served.ServeError as exc:
            raise abtest.SideError(side, exc.stage, str(exc), exc.tail) from exc
        out[side] = abtest.sample(side, length, -1, 0, prompt, gen, t)
    return out


def _spec_served(ctx: _Ctx, profile: Profile, name: str, procs: dict[Side, served.ServedProcess],
                 run: abtest.Run, block: int, pool: abtest.Prompts) -> tuple[list[SpecResult], list[str]]:
    """Speculative decoding on the harness's clock at every scored context. Each run takes a prompt an
    earlier block timed (so these processes never saw it, and nothing can be replayed from a cache),
    and decodes it speculatively on both sides: lossless means the very tokens that side's plain decode
    produced; plain speed comes from those timed requests. Also the notes on tau (diagnostics)."""
    g = ctx.cfg.rules.gates.spec
    gen = profile.measurement.decode_tokens
    last = run.blocks - 1
    out, notes = [], []
    for c in profile.contexts:
        if not c.scored:
            continue
        earlier: dict[tuple[int, int], dict[Side, abtest.Sample]] = {}
        for smp in run.samples:
            if smp.context == c.ctx and smp.block != last:
                earlier.setdefault((smp.block, smp.pair), {})[smp.side] = smp
        pairs = [v for _, v in sorted(earlier.items()) if len(v) == 2][: g.runs]
        while len(pairs) < g.runs:  # too few earlier pairs (a small --max-pairs): plain-decode new prompts here
            pairs.append(_plain_pair(ctx, procs, pool, c.ctx, gen))
        sp: dict[Side, list[float]] = {Side.BASE: [], Side.HEAD: []}
        taus: dict[Side, list[float]] = {Side.BASE: [], Side.HEAD: []}
        lossless, first_div = 0, None
        for r, pair in enumerate(pairs):
            for side in ((Side.BASE, Side.HEAD) if r % 2 == 0 else (Side.HEAD, Side.BASE)):
                p, others, ar = procs[side], [q for s2, q in procs.items() if s2 is not side], pair[side]
                req = {"op": "spec", "prompt_ids": list(ar.prompt), "max_new": gen, "block": block,
                       "drafter": "ngram", "ngram": 3}
                try:
                    t = served.run_alone(p, others, lambda p=p, req=req: p.request(req, ctx.run_timeout_s))
                except served.ServeError as exc:
                    raise abtest.SideError(side, exc.stage, str(exc), exc.tail) from exc
                sp[side].append(t.decode_tps)
                taus[side].append((len(t.tokens) - 1) / max(len(t.steps) - 1, 1))
                if side is Side.HEAD:
                    if list(t.tokens) == list(ar.tokens):
                        lossless += 1
                    else:
                        at = next((i for i, (x, y) in enumerate(zip(ar.tokens, t.tokens, strict=False)) if x != y),
                                  min(len(ar.tokens), len(t.tokens)))
                        first_div = at if first_div is None else min(first_div, at)
        if not pairs:
            continue
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        result = SpecResult(
            target=name, drafter="ngram-3", block_size=block, runs=len(pairs), lossless_runs=lossless,
            first_divergence=first_div, base_tau=mean(taus[Side.BASE]), head_tau=mean(taus[Side.HEAD]),
            ar_pairs=tuple((pr[Side.BASE].decode_tps, pr[Side.HEAD].decode_tps) for pr in pairs),
            spec_pairs=tuple(zip(sp[Side.BASE], sp[Side.HEAD], strict=True)), context=c.ctx,
            base_tau_runs=tuple(taus[Side.BASE]), head_tau_runs=tuple(taus[Side.HEAD]))
        out.append(result)
        note = tau_note(result)
        if note:
            notes.append(note)
        ctx.log(f"speculative, ctx {c.ctx}: lossless {lossless}/{len(pairs)}, tau {result.base_tau:.2f} -> "
                f"{result.head_tau:.2f}")
    return out, notes


def tau_note(s: SpecResult) -> str | None:
    """A tau that moved, either way, beyond the run-to-run noise: shown, since with the same drafter a
    rising tau means the target model's outputs changed."""
    runs = [*s.base_tau_runs, *s.head_tau_runs]
    if len(s.base_tau_runs) < 2 or len(s.head_tau_runs) < 2:
        return None
    mean = sum(runs) / len(runs)
    noise = max((sum((x - mean) ** 2 for x in s.base_tau_runs) / (len(s.base_tau_runs) - 1)) ** 0.5, 0.01)
    moved = s.head_tau - s.base_tau
    if abs(moved) <= 2 * noise:
        return None
    way = "rose" if moved > 0 else "fell"
    why = "; with the same drafter, the target model's outputs changed" if moved > 0 else ""
    return (f"speculative tau {way} from {s.base_tau:.2f} to {s.head_tau:.2f} at ctx {s.context} (run-to-run "
            f"noise {noise:.2f}){why}")


def _diagnostics(samples: list[abtest.Sample], max_gap: float) -> list[str]:
    """What the harness noticed that decides nothing: engines whose own clocks disagree with it."""
    notes = []
    for side in (Side.BASE, Side.HEAD):
        gaps = sorted(g for s in samples if s.side is side and (g := s.self_report_gap) is not None)
        if gaps and gaps[len(gaps) // 2] > max_gap:
            notes.append(f"{SIDE_LABEL[side]}'s engine reports decode times {gaps[len(gaps) // 2]:.0%} away from the "
                         f"harness's clock (median over {len(gaps)} requests); only the harness's times count")
        wrong_n = sum(1 for s in samples if s.side is side and s.reported_n not in (None, len(s.tokens)))
        if wrong_n:
            notes.append(f"{SIDE_LABEL[side]}'s engine reported a token count other than it streamed in {wrong_n} "
                         "requests; only the streamed tokens count")
    return notes


def _sandbox_spec(ctx: _Ctx, venv: Path, scratch: Path, extra_binds: list[Path], timeout_s: float) -> sandbox.SandboxSpec:
    """The sandbox of one engine process: scratch is the only writable place, the env is scrubbed."""
    scratch.mkdir(exist_ok=True)
    env = sandbox.scrub_env(os.environ)
    cores = str(os.cpu_count() or 1)
    env.update({"HOME": str(scratch), "TMPDIR": str(scratch), "XDG_CACHE_HOME": str(scratch / ".cache"),
                "OMP_NUM_THREADS": cores, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
                "TRITON_CACHE_DIR": str(scratch / ".triton"), "TORCHINDUCTOR_CACHE_DIR": str(scratch / ".inductor")})
    return sandbox.SandboxSpec(
        ro_binds=tuple(dict.fromkeys([*ctx.ro_binds, venv, *extra_binds])), scratch=scratch, workdir=scratch, env=env,
        limits=sandbox.Limits(cpu_seconds=int(timeout_s * (os.cpu_count() or 1)), memory_bytes=48 << 30,
                              max_output_bytes=ctx.max_output_bytes, timeout_s=timeout_s),
        devices=sandbox.gpu_devices() if ctx.profile_device == "cuda" else (),
    )


def _sandboxed_python(ctx: _Ctx, venv: Path, scratch: Path, argv: list[str], extra_binds: list[Path],
                      timeout_s: float) -> sandbox.RunResult:
    """`python -m argv` from a venv under bubblewrap: scratch is the only writable place, the env is scrubbed."""
    spec = _sandbox_spec(ctx, venv, scratch, extra_binds, timeout_s)
    return sandbox.run(spec, [str(venv / "bin" / "python"), "-m", *argv], no_sandbox=ctx.cfg.no_sandbox)


def _confine_build(argv: list[str], writable: Path) -> list[str]:
    """A revision's build step under bubblewrap: no network, only its temp dir writable, no secrets."""
    env = builds.build_environ(sandbox.scrub_env(os.environ)) | {"HOME": str(writable),
                                                                 "TMPDIR": str(writable / "tmp")}
    spec = sandbox.SandboxSpec(
        ro_binds=tuple(_ro_binds([])), scratch=writable,
        workdir=writable, env=env, limits=sandbox.Limits(cpu_seconds=3600, memory_bytes=16 << 30),
    )
    return sandbox.bwrap_argv(spec, argv)


def _reference(ctx: _Ctx, path: Path, text: Path) -> tuple[Path, dict[str, Any]]:
    """llama.cpp's log-probs for the accuracy text (computed, or loaded from its cache), and its identity.

    The reference is harness code (main's llama.cpp wrapper and tokenizer), run as trusted so that its
    cache (keyed by model sha256, the reference build's identity and the token ids) persists across
    evaluations. It runs before the PR is built or any pair is timed: a reference that cannot run ends
    the evaluation at once, saying how it died.
    """
    p = ctx.cfg.positions
    ref = ctx.scratch / "reference" / f"{path.stem}.npy"
    ref.parent.mkdir(exist_ok=True)
    ctx.log(f"{path.stem}: llama.cpp reference over {p} positions")
    venv = ctx.sides[Side.BASE].build.venv
    assert venv is not None
    # -I and a neutral cwd: `-m` would otherwise put the bot's working directory (which may hold an
    # `engine/` of its own) ahead of main's venv on sys.path
    res = sandbox.run_trusted([str(venv / "bin" / "python"), "-I", "-m", "engine.reference", "score", "--model",
                               str(path), "--text-file", str(text), "--positions", str(p), "--out", str(ref)],
                              timeout_s=REFERENCE_TIMEOUT_S, cwd=ref.parent, max_output_bytes=1 << 20)
    if not res.ok:
        raise SideFailed(Failure(Side.HARNESS, "reference", "the llama.cpp reference "
                                 + describe_exit(res.returncode, timed_out=res.timed_out, timeout_s=REFERENCE_TIMEOUT_S),
                                 _tail(res.stderr)))
    try:
        record = json.loads(res.stdout.strip().splitlines()[-1])
        config = record.get("config") or {}
    except (ValueError, IndexError, AttributeError, TypeError) as exc:
        raise SideFailed(Failure(Side.HARNESS, "reference", f"the llama.cpp reference printed no record: {exc}",
                                 _tail(res.stdout + res.stderr))) from exc
    identity = {"engine": record.get("engine"), "cached": bool(record.get("cached")),
                **(config.get("reference_build") or {"version": config.get("llama_cpp")})}
    return ref, identity


REFERENCE_TIMEOUT_S = 1800
TAIL_CHARS = 2000


def _tail(text: str) -> str:
    return text[-TAIL_CHARS:]


def _accuracy_served(ctx: _Ctx, name: str, procs: dict[Side, served.ServedProcess], ref: Path) -> AccuracyResult:
    """Each side's serving engine scores the reference's token ids (teacher-forced, every position's full
    log-probabilities written to its scratch); main's `engine.compare` sets each against llama.cpp's."""
    try:
        ids = json.loads(Path(f"{ref}.json").read_text())["token_ids"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SideFailed(Failure(Side.HARNESS, "reference", f"the reference left no token ids: {exc}")) from exc
    ctx.log(f"{name}: accuracy vs llama.cpp over {len(ids) - 1} positions")
    outs: dict[Side, Path] = {}
    for side, p in procs.items():
        others = [q for s, q in procs.items() if s is not side]
        name_npy = f"{side.value}-score.npy"
        try:
            served.run_alone(p, others, lambda p=p, n=name_npy: p.request(
                {"op": "score", "ids": ids, "from": 1, "save": n}, ctx.run_timeout_s))
        except served.ServeError as exc:
            raise abtest.SideError(side, exc.stage, str(exc), exc.tail) from exc
        made = ctx.serve_scratch[side] / name_npy
        if not made.is_file() or made.is_symlink():
            found = sorted(x.name for x in ctx.serve_scratch[side].iterdir())[:20] if ctx.serve_scratch[side].is_dir() \
                else "no folder"
            raise SideFailed(Failure(side, "accuracy", f"the engine wrote no {name_npy} in its working directory "
                                     f"{ctx.serve_scratch[side]} (it holds: {found})"))
        # the sidecar is the harness's own: the ids the reference scored, never what the engine says
        Path(f"{made}.json").write_text(json.dumps({"token_ids": ids}))
        outs[side] = made
    base_stats = _compare(ctx, ref, outs[Side.BASE], Side.BASE)
    head_stats = _compare(ctx, ref, outs[Side.HEAD], Side.HEAD)
    return AccuracyResult(name, len(ids) - 1, float(head_stats["top1_agreement"]), float(head_stats["kl_mean"]),
                          float(head_stats["ppl_ratio"]), base_top1_agreement=float(base_stats["top1_agreement"]),
                          base_kl_mean=float(base_stats["kl_mean"]))


def _compare(ctx: _Ctx, ref: Path, test: Path, side: Side) -> dict[str, Any]:
    """main's engine.compare over two score files (read as data), sandboxed like everything else."""
    venv = ctx.sides[Side.BASE].build.venv
    assert venv is not None
    scratch = _fresh_scratch(ctx, "compare")
    try:
        res = _sandboxed_python(ctx, venv, scratch, ["engine.compare", str(ref), str(test), "--json"],
                                [ref.parent, test.parent], 600)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if res.returncode != 0:
        # different token ids mean the side changed tokenization: that side's fault
        raise SideFailed(Failure(side, "accuracy", "cannot compare with llama.cpp: " + res.stderr.strip()[-500:]))
    return json.loads(res.stdout)


# --- trusted helpers --------------------------------------------------------------------------------


def _fetch_models(ctx: _Ctx, profile: Profile) -> dict[str, Path]:
    """Registry models fetched and verified by main's fetcher (trusted, outside the sandbox: it needs the network)."""
    names = [m.name for m in profile.models if m.source == "registry"]
    if ctx.cfg.spec and ctx.cfg.spec_drafter == "draft":
        names += [ctx.cfg.rules.spec_pair.target.name, ctx.cfg.rules.spec_pair.draft.name]
    venv = ctx.sides[Side.BASE].build.venv
    assert venv is not None
    out: dict[str, Path] = {}
    for name in dict.fromkeys(names):
        ctx.log(f"fetching {name}")
        res = sandbox.run_trusted([str(venv / "bin" / "python"), "-I", "-m", "engine.registry", "fetch", name],
                                  timeout_s=3600, cwd=ctx.scratch)  # -I, neutral cwd: main's fetcher, no other
        if not res.ok:
            raise SideFailed(Failure(Side.HARNESS, "models", f"cannot fetch {name}: main's fetcher "
                                     + describe_exit(res.returncode, timed_out=res.timed_out, timeout_s=3600),
                                     _tail(res.stderr)))
        lines = res.stdout.strip().splitlines()
        if not lines or not Path(lines[-1]).is_file():
            raise SideFailed(Failure(Side.HARNESS, "models", f"main's fetcher named no file for {name}",
                                     _tail(res.stdout + res.stderr)))
        out[name] = Path(lines[-1])
    pinned = {m.name: m.sha256 for m in profile.models if m.sha256}
    for ref in (ctx.cfg.rules.spec_pair.target, ctx.cfg.rules.spec_pair.draft):
        if ref.sha256:
            pinned[ref.name] = ref.sha256
    for name, path in out.items():
        digest = _sha_of(ctx, path)
        if name in pinned and pinned[name] != digest:
            raise SideFailed(Failure(Side.HARNESS, "models", f"{name} has sha256 {digest}, rules pin {pinned[name]}"))
    return out


def _sha_of(ctx: _Ctx, path: Path) -> str:
    side = path.with_name(path.name + ".sha256")
    try:
        return side.read_text().split()[1]
    except (OSError, IndexError):
        import hashlib

        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
        return h.hexdigest()


def _ro_binds(model_dirs: list[Path]) -> list[Path]:
    """What sandboxed code may read: system dirs, the interpreters, the models. Never the bot's state."""
    interpreters = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}
    return list(dict.fromkeys([*sandbox.system_ro_binds(), *sorted(interpreters), *model_dirs]))
