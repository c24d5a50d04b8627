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
from typing import Any, TypeVar

from evalbot import stats
from evalbot.evaluate import box, builds, prompts, sandbox, schema
from evalbot.evaluate.exits import describe_exit
from evalbot.model import (
    AccuracyResult,
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
T = TypeVar("T")


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


@dataclass
class _Side:
    side: Side
    worktree: builds.Worktree
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


def evaluate(cfg: EvalConfig, log: Log) -> Measurements:
    """Run the whole evaluation; every failure ends up in Measurements.failures, never as an exception.

    The harness's own steps come first and fail fast with their cause: main's build, the models, and
    the llama.cpp reference (computed or loaded from its cache). Only then is the PR built, and only on
    a quiet box are the A/B pairs run.
    """
    started = box.now()
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
        base_sha, _ = builds.resolve(cfg.repo, cfg.base)
        head_sha, _ = builds.resolve(cfg.repo, cfg.head)
        measured = builds.merge_commit(cfg.repo, base_sha, head_sha)
        shas: dict[str, Any] = {"base_sha": base_sha, "head_sha": head_sha, "measured_sha": measured or "",
                                "harness_sha": base_sha}
        if measured is None:
            return done(prov=shas, skipped_reason=f"the PR conflicts with main {base_sha[:12]}: rebase it and push")
        base_wt = builds.prepare_worktree(cfg.repo, base_sha, cfg.work_root / "worktrees")
        head_wt = builds.prepare_worktree(cfg.repo, measured, cfg.work_root / "worktrees")
    except builds.BuildError as exc:
        return done(failures=(Failure(Side.HARNESS, "git", str(exc)),))
    hits = harness_hits(builds.changed_paths(cfg.repo, base_sha, head_sha), cfg.rules)
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
                drift = builds.harness_drift(*(builds.harness_fingerprint(ctx.sides[s].build.venv, modules)  # type: ignore[arg-type]
                                               for s in (Side.BASE, Side.HEAD)))
            except builds.BuildError as exc:
                return done(prov=shas, failures=(Failure(Side.HARNESS, "harness", str(exc)),))
            if drift:
                return done(prov=shas, skipped_reason="the built PR does not import main's harness, so the bot "
                            "never runs it: " + "; ".join(drift[:5]))
        # 3. the A/B pairs, on a quiet box, then the gates
        throughput: list[ThroughputPairs] = []
        accuracy: list[AccuracyResult] = []
        spec_results: list[SpecResult] = []
        failures: list[Failure] = []
        try:
            for ref in profile.models:
                if ref.source == "registry":
                    path = models[ref.name]
                    throughput += _measure_contexts(ctx, profile, ref.name, ["--model", str(path)], prompt_files[0])
                    if cfg.accuracy:
                        accuracy.append(_accuracy(ctx, ref.name, path, prompt_files[1], references[ref.name]))
                else:  # a real model's shape with random weights: timing only, where the file cannot travel
                    throughput += _measure_contexts(ctx, profile, ref.name,
                                                    ["--random-weights", "--shape", ref.name], prompt_files[0])
            if cfg.spec and models and cfg.rules.spec_pair.profile == cfg.profile:
                spec_results.append(_spec(ctx, models, prompt_files[0], cfg.spec_drafter))
            elif cfg.spec:  # the spec gates belong to the spec pair's profile (models.yaml)
                log(f"speculative gates skipped: they run on the '{cfg.rules.spec_pair.profile}' profile")
        except SideFailed as exc:
            failures.append(exc.failure)
        except box.BoxBusy as exc:
            failures.append(Failure(Side.HARNESS, "box", str(exc)))
        return done(prov=shas, throughput=tuple(throughput), accuracy=tuple(accuracy), spec=tuple(spec_results),
                    failures=tuple(failures))


def _build_side(ctx: _Ctx, side: Side, wt: builds.Worktree) -> Failure | None:
    """Build one revision into its venv; the Failure to record when it does not build."""
    ctx.log(f"building {side.value} {wt.sha[:12]}")
    b = builds.build_env(wt, ctx.cfg.work_root / "venvs", python=ctx.cfg.python, log_dir=ctx.cfg.work_root / "logs",
                         timeout_s=1800, confine=None if ctx.cfg.no_sandbox else _confine_build)
    ctx.sides[side] = _Side(side, wt, b)
    if b.ok:
        return None
    return Failure(side, b.failure_stage or "build", b.message, b.log_tail)


# --- engine runs ----------------------------------------------------------------------------------


def _run_engine(ctx: _Ctx, side: Side, argv: list[str], command: str, timeout_s: float | None = None,
                keep: Path | None = None) -> dict[str, Any]:
    """Run `python -m <argv>` from a side's venv in the sandbox; the validated JSON record."""
    return _run_engine_timed(ctx, side, argv, command, timeout_s, keep)[0]


def _run_engine_timed(ctx: _Ctx, side: Side, argv: list[str], command: str, timeout_s: float | None = None,
                      keep: Path | None = None) -> tuple[dict[str, Any], float]:
    """The validated record and the process's wall time as seen from outside.

    Every run gets a fresh, empty scratch dir (its HOME, TMPDIR and caches), deleted afterwards, so a
    head cannot carry anything from one run to the next. `{scratch}` in argv names that dir; a file
    the run must hand back is written there as `{scratch}/<name>` and moved to `keep/<name>`.
    A failed run is retried once before it counts: a one-off crash of the box must not decide a verdict.
    A timeout or an output flood is not retried: it would only cost the same again.
    """
    timeout_s = timeout_s or ctx.run_timeout_s
    try:
        return _run_engine_once(ctx, side, argv, command, timeout_s, keep)
    except SideFailed as first:
        if first.failure.stage in ("timeout", "output"):
            raise
        ctx.log(f"{side.value}: {first.failure.message}; retrying once")
        return _run_engine_once(ctx, side, argv, command, timeout_s, keep)


def _fresh_scratch(ctx: _Ctx, label: str) -> Path:
    ctx.runs += 1
    path = ctx.scratch / "runs" / f"{ctx.runs:05d}-{label}"
    path.mkdir(parents=True)
    return path


def _run_engine_once(ctx: _Ctx, side: Side, argv: list[str], command: str, timeout_s: float,
                     keep: Path | None) -> tuple[dict[str, Any], float]:
    venv = ctx.sides[side].build.venv
    assert venv is not None
    scratch = _fresh_scratch(ctx, side.value)
    try:
        res = _sandboxed_python(ctx, venv, scratch, [a.replace("{scratch}", str(scratch)) for a in argv],
                                [ctx.scratch / "prompts"], timeout_s)
        tail = res.stderr[-3000:]
        if res.output_truncated:
            raise SideFailed(Failure(side, "output", f"`{' '.join(argv[:2])}` printed more than "
                                     f"{ctx.max_output_bytes >> 20} MiB on stdout or stderr and was stopped", tail))
        if res.timed_out:
            raise SideFailed(Failure(side, "timeout", f"`{' '.join(argv[:2])}` exceeded {timeout_s:.0f} s", tail))
        if res.returncode != 0:
            raise SideFailed(Failure(side, "run", f"`{' '.join(argv[:2])}` exited with {res.returncode}", tail))
        try:
            record = schema.parse_and_validate(res.stdout, command)
        except schema.RecordError as exc:
            raise SideFailed(Failure(side, "schema", f"invalid `{command}` record: {exc}", tail)) from exc
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for item in scratch.iterdir():
                if item.is_file() and not item.is_symlink() and item.suffix in (".npy", ".npz", ".json"):
                    shutil.move(str(item), keep / item.name)
        return record, res.duration_s
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def reported_seconds(record: dict[str, Any]) -> float:
    """The seconds a bench record's own timings account for: load, warm-up, and the timed prefill and decode."""
    t = record.get("timings") or {}
    keys = ("load_s", "warmup_s", "prefill_s", "decode_s")
    return float(sum(v for k, v in t.items() if k in keys and isinstance(v, (int, float)) and v >= 0))


def _measure_contexts(ctx: _Ctx, profile: Profile, name: str, model_args: list[str],
                      prompt: Path) -> list[ThroughputPairs]:
    m = profile.measurement
    max_pairs = ctx.cfg.max_pairs or m.max_pairs
    budget = m.time_budget_s / max(1, len(profile.contexts))
    out: list[ThroughputPairs] = []
    for c in profile.contexts:
        prefill: list[tuple[float, float]] = []
        walls: list[tuple[float, float]] = []
        reported: list[tuple[float, float]] = []
        count = 0

        def one_pair(c=c, prefill=prefill, walls=walls, reported=reported) -> tuple[float, float]:
            nonlocal count
            argv = ["engine", "bench", *model_args, "--ctx", str(c.ctx), "--gen", str(m.decode_tokens),
                    "--runs", "1", "--warmup", str(m.warmup_runs), "--prompt-file", str(prompt),
                    "--device", profile.device]
            order = (Side.BASE, Side.HEAD) if count % 2 == 0 else (Side.HEAD, Side.BASE)  # ABBA
            timed, sample = _quiet_pair(ctx, lambda: {s: _run_engine_timed(ctx, s, argv, "bench") for s in order})
            ctx.box_samples.append({"model": name, "context": c.ctx, "pair": count + 1, **sample})
            recs = {s: rec for s, (rec, _) in timed.items()}
            walls.append((timed[Side.BASE][1], timed[Side.HEAD][1]))
            reported.append((reported_seconds(recs[Side.BASE]), reported_seconds(recs[Side.HEAD])))
            count += 1
            prefill.append((recs[Side.BASE]["prefill_tps"], recs[Side.HEAD]["prefill_tps"]))
            b, h = recs[Side.BASE]["decode_tps"], recs[Side.HEAD]["decode_tps"]
            ctx.log(f"{name} ctx {c.ctx} pair {count}: main {b:.2f} tok/s, PR {h:.2f} tok/s ({h / b - 1:+.1%})")
            return b, h

        run = stats.run_adaptive(one_pair, target_half_width=m.ci_half_width, min_pairs=min(m.min_pairs, max_pairs),
                                 max_pairs=max_pairs, budget_s=budget)
        ctx.log(f"{name} ctx {c.ctx}: {run.estimate.ratio:.4f}x [{run.estimate.ci_low:.4f}, "
                f"{run.estimate.ci_high:.4f}] after {run.estimate.n} pairs ({run.reason})")
        out.append(ThroughputPairs(name, c.ctx, "decode_tps", run.pairs, guarded=c.guarded, scored=c.scored,
                                   walls=tuple(walls[: len(run.pairs)]), reported=tuple(reported[: len(run.pairs)])))
        # prefill is guarded like decode (no regression) but earns no tier, as in the seeds' guards
        out.append(ThroughputPairs(name, c.ctx, "prefill_tps", tuple(prefill), guarded=c.guarded, scored=False))
    return out


CONTAMINATED_RETRIES = 3


def _quiet_pair(ctx: _Ctx, run_pair: Callable[[], T]) -> tuple[T, dict[str, Any]]:
    """Run one A/B pair on a quiet box: wait for quiet first, and measure the pair again when other
    processes used the CPU while it ran. BoxBusy when the box will not stay quiet."""
    gpu = ctx.profile_device == "cuda"
    for _attempt in range(CONTAMINATED_RETRIES):
        before, waited = box.wait_until_quiet(ctx.quiet, with_gpu=gpu, log=ctx.log)
        start = box.cpu_snapshot()
        result = run_pair()
        during = box.usage(start, box.cpu_snapshot(), os.getpid())
        sample = {**box.state(), "waited_s": round(waited, 1), **before.as_record(),
                  "during_other_cores": round(during.other_cores, 3),
                  "during_others_top": [f"{n} {c:.2f}" for n, c in during.top]}
        reason = box.busy_reason(during, ctx.quiet)
        if reason is None:
            return result, sample
        ctx.log(f"pair measured again: while it ran, {reason}")
    raise box.BoxBusy(f"box busy: {reason}, during {CONTAMINATED_RETRIES} attempts at one pair")


def _sandboxed_python(ctx: _Ctx, venv: Path, scratch: Path, argv: list[str], extra_binds: list[Path],
                      timeout_s: float) -> sandbox.RunResult:
    """`python -m argv` from a venv under bubblewrap: scratch is the only writable place, the env is scrubbed."""
    scratch.mkdir(exist_ok=True)
    env = sandbox.scrub_env(os.environ)
    cores = str(os.cpu_count() or 1)
    env.update({"HOME": str(scratch), "TMPDIR": str(scratch), "XDG_CACHE_HOME": str(scratch / ".cache"),
                "OMP_NUM_THREADS": cores, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
                "TRITON_CACHE_DIR": str(scratch / ".triton"), "TORCHINDUCTOR_CACHE_DIR": str(scratch / ".inductor")})
    spec = sandbox.SandboxSpec(
        ro_binds=tuple(dict.fromkeys([*ctx.ro_binds, venv, *extra_binds])), scratch=scratch, workdir=scratch, env=env,
        limits=sandbox.Limits(cpu_seconds=int(timeout_s * (os.cpu_count() or 1)), memory_bytes=48 << 30,
                              max_output_bytes=ctx.max_output_bytes, timeout_s=timeout_s),
        devices=sandbox.gpu_devices() if ctx.profile_device == "cuda" else (),
    )
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
        config = record["config"]
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise SideFailed(Failure(Side.HARNESS, "reference", f"the llama.cpp reference printed no record: {exc}",
                                 _tail(res.stdout + res.stderr))) from exc
    identity = {"engine": record.get("engine"), "cached": bool(record.get("cached")),
                **(config.get("reference_build") or {"version": config.get("llama_cpp")})}
    return ref, identity


REFERENCE_TIMEOUT_S = 1800
TAIL_CHARS = 2000


def _tail(text: str) -> str:
    return text[-TAIL_CHARS:]


def _accuracy(ctx: _Ctx, name: str, path: Path, text: Path, ref: Path) -> AccuracyResult:
    """Head (and base) `score` against llama.cpp's logits (already computed) on the same GGUF and token ids."""
    p = ctx.cfg.positions
    results = ctx.scratch / "results"
    outs = {Side.BASE: results / "base.npy", Side.HEAD: results / "head.npy"}
    ctx.log(f"{name}: accuracy vs llama.cpp over {p} positions")
    for side, out in outs.items():
        _run_engine(ctx, side, ["engine", "score", "--model", str(path), "--text-file", str(text),
                                "--positions", str(p), "--out", "{scratch}/" + out.name], "score", keep=results)
    base_stats = _compare(ctx, ref, outs[Side.BASE], Side.BASE)
    head_stats = _compare(ctx, ref, outs[Side.HEAD], Side.HEAD)
    return AccuracyResult(name, p, float(head_stats["top1_agreement"]), float(head_stats["kl_mean"]),
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


def _spec(ctx: _Ctx, models: dict[str, Path], prompt: Path, drafter: str) -> SpecResult:
    pair = ctx.cfg.rules.spec_pair
    g = ctx.cfg.rules.gates.spec
    if drafter == "ngram":
        # the quick form: n-gram prompt lookup on the profile's own model (no second model to load)
        target = next(iter(models))
        draft_args, label = ["--ngram", "3"], "ngram-3"
    else:
        target = pair.target.name
        draft_args, label = ["--draft", str(models[pair.draft.name])], f"draft:{pair.draft.name}"
    argv = ["engine", "spec", "--model", str(models[target]), *draft_args, "--ctx", "128", "--gen", "64",
            "--block", str(pair.block), "--runs", str(g.runs), "--prompt-file", str(prompt)]
    ctx.log(f"speculative decoding: {label} for {target}, {g.runs} runs per side")
    recs = {s: _run_engine(ctx, s, argv, "spec") for s in (Side.BASE, Side.HEAD)}
    b, h = recs[Side.BASE], recs[Side.HEAD]
    return SpecResult(
        target=target, drafter=label, block_size=pair.block, runs=int(h["counts"]["runs"]),
        lossless_runs=int(h["lossless_runs"] or 0), first_divergence=h.get("first_divergence"),
        base_tau=float(b["mean_accept"]), head_tau=float(h["mean_accept"]),
        ar_pairs=tuple(zip(b["ar_tps_runs"], h["ar_tps_runs"], strict=False)),
        spec_pairs=tuple(zip(b["spec_tps_runs"], h["spec_tps_runs"], strict=False)),
    )


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
        res = sandbox.run_trusted([str(venv / "bin" / "python"), "-I", "-m", "engine.models", "fetch", name],
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
