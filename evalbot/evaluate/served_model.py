"""One model's served measurement: A/B pairs in blocks of warm serving processes on the harness's clock,
then the decode audit, speculative decoding and the accuracy gates against the same processes.

Each side's serving process runs sandboxed in its own emptied side folder (with a copy of the side's
first compile, once kept), metered (and frozen) in a cgroup of its own, capped at the profile's cores
where the box allows. Each side's failure is the side's (main's: an infra error).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from evalbot import verdict
from evalbot.evaluate import (
    abtest,
    audit,
    builds,
    compile_cache,
    cpumeter,
    device_idle,
    pinning,
    prompts,
    protocols,
    served,
)
from evalbot.evaluate.ab_block import Launch
from evalbot.evaluate.ab_samples import Prompts, Run, Sample, SideError, throughput
from evalbot.evaluate.ab_sampling import REQUEST_CPU_SLACK
from evalbot.evaluate.context import (
    SIDE_LABEL,
    RunContext,
    SideFailed,
    sandbox_spec,
    toolchain_paths,
    usable_cores,
)
from evalbot.evaluate.freezing import FREEZER
from evalbot.evaluate.reference import accuracy_served, audit_answers
from evalbot.evaluate.schedule import run_alone
from evalbot.evaluate.speculative import SpecRuns, spec_here
from evalbot.model import AccuracyResult, DecodeAudit, Failure, Side, SpecResult, ThroughputPairs
from evalbot.rules import Profile


@dataclass
class ModelResult:
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


def _launcher(
    ctx: RunContext, model_args: list[str], max_seq: int, warmup: int, model: Path | None
) -> Launch:
    """Start one side's serving engine as the rules' engine.yaml declares it, sandboxed, in its emptied side
    folder (with a copy of the side's first compile, once kept), with the profile's device."""

    def launch(side: Side) -> served.ServedProcess:
        venv = ctx.sides[side].build.venv
        assert venv is not None
        scratch, root = serve_dirs(ctx, side)
        ctx.serve_scratch[side] = scratch
        engine = ctx.ws.rules.engine
        port = protocols.port_for(engine.protocol, not ctx.req.options.no_sandbox)
        argv = engine.serve_argv(  # engine.yaml's serve template
            model_args,
            python=str(venv / "bin" / "python"),
            tree=str(venv / builds.TREE),
            max_seq=str(max_seq),
            device=ctx.profile_device,
            warmup=str(max(1, warmup)),
            port=port,
            threads=str(ctx.engine_threads or usable_cores()),
        )
        how = protocols.serving(engine.protocol, argv, port, model)
        spec = sandbox_spec(
            ctx,
            venv,
            scratch,
            [ctx.scratch / "prompts", *toolchain_paths(ctx), *how.binds],
            ctx.req.profile.measurement.time_budget_s + ctx.run_timeout_s,
            side_root=root,
        )
        meter = cpumeter.make_meter(side.value)
        threads = ctx.req.profile.measurement.threads
        if threads:  # the kernel holds the tree to its cores (with the checks' slack), where the box lets it
            meter.cap(threads * REQUEST_CPU_SLACK)
        return served.ServedProcess.start(
            SIDE_LABEL[side],
            spec,
            how.argv,
            no_sandbox=ctx.req.options.no_sandbox,
            meter=meter,
            protocol=engine.protocol,
        )

    return launch


def _audit(
    ctx: RunContext, run: Run, procs: dict[Side, served.ServedProcess], registry: bool, name: str
) -> list[DecodeAudit]:
    """The decode audit: the rules' share of the timed requests, chosen after the runs; where the head's
    tokens cannot tell a pass from a fail (`verdict.audits_open`), every timed request at that context."""
    gate = ctx.ws.rules.gates.decode_audit
    chosen = audit.choose(run.samples, share=gate.share, minimum=gate.min_requests)
    answers, judge_name = audit_answers(ctx, chosen, procs, registry, name)
    audits = audit.judge(name, judge_name, chosen, answers, gate.near_tie)
    more = audit.widen(run.samples, chosen, verdict.audits_open(audits, ctx.ws.rules))
    if more:
        where = ", ".join(str(c) for c in sorted({s.context for s in more}))
        ctx.log(f"{name}: the audit cannot tell yet at ctx {where}: {len(more)} more timed requests audited")
        extra, _ = audit_answers(ctx, more, procs, registry, name)
        chosen = [*chosen, *more]
        audits = audit.judge(name, judge_name, chosen, {**answers, **extra}, gate.near_tie)
    return audits


def measure_model(
    ctx: RunContext,
    profile: Profile,
    name: str,
    model_args: list[str],
    corpus: Path,
    seed: int,
    registry: bool,
    reference: Path | None = None,
) -> ModelResult:
    """A/B pairs in blocks of warm serving processes, then the decode audit and speculative decoding, all on
    the harness's clock; each side's failure is the side's (main's: an infra error)."""
    m = profile.measurement
    block = ctx.ws.rules.spec_pair.block
    longest = m.max_decode_tokens if m.decode_s is not None else m.decode_tokens
    max_seq = max(c.ctx for c in profile.contexts) + longest + block + 8
    launch = _launcher(ctx, model_args, max_seq, m.warmup_runs, ctx.model_paths.get(name))
    texts = prompts.load_corpus(corpus)
    procs: dict[Side, served.ServedProcess] = {}

    def tokenized(ctx_len: int, serial: int) -> list[int]:
        text = prompts.draw_from(texts, (seed * 1_000_003 + serial) % 2**53, 8 * ctx_len + 64, 1)[0].text
        main = procs[Side.BASE]
        got = run_alone(
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

    probe = _gpu_probe(ctx) if profile.device == "cuda" else None

    def launch_tracked(side: Side) -> served.ServedProcess:
        procs[side] = launch(side)
        procs[side].device = probe
        return procs[side]

    source = tokenized if registry else None
    pool = Prompts(source or (lambda c, i: abtest.random_prompts(procs[Side.BASE].vocab, seed)(c, i)))
    spec_runs = None
    if ctx.req.options.spec and spec_here(ctx):
        spec_runs = SpecRuns(ctx, profile, name, block, pool)
    try:
        cpumeter.sweep_stale()
        run, procs = abtest.measure(
            profile,
            launch_tracked,
            pool,
            ctx.log,
            max_pairs=ctx.req.options.max_pairs,
            request_timeout_s=ctx.run_timeout_s,
            ready_timeout_s=ctx.run_timeout_s,
            progress=ctx.ws.progress,
            decided=lambda samples: verdict.no_pair_could_change(
                throughput(samples, profile, name), ctx.ws.rules
            ),
            settled=lambda ready: keep_compiles(ctx, ready),
            between=spec_runs.in_block if spec_runs is not None else None,
        )
        ctx.box_samples.extend(run.box_samples)
        audits = _audit(ctx, run, procs, registry, name)
        spec: list[SpecResult] = []
        tau_notes: list[str] = []
        if spec_runs is not None:
            spec, tau_notes = spec_runs.finish(procs, run)
        accuracy = accuracy_served(ctx, name, procs, reference) if reference is not None else None
        return ModelResult(
            throughput(run.samples, profile, name),
            audits,
            spec,
            [
                *_diagnostics(run.samples, ctx.ws.rules.gates.timing.max_self_report_gap),
                *_freeze_notes(procs.values(), profile.measurement.threads),
                *_clock_notes(run),
                *tau_notes,
            ],
            accuracy,
        )
    except SideError as exc:
        raise SideFailed(Failure(exc.side, exc.stage, str(exc), exc.tail)) from exc
    except served.ServeError as exc:  # main's process, serving the harness (tokenizing, auditing)
        raise SideFailed(Failure(Side.BASE, exc.stage, str(exc), exc.tail)) from exc
    except device_idle.ProbeError as exc:  # the box's probe, never a side's fault
        raise SideFailed(Failure(Side.HARNESS, "gpu-probe", str(exc))) from exc
    finally:
        for p in procs.values():
            p.close()
        if probe is not None:
            probe.close()


def _gpu_probe(ctx: RunContext) -> device_idle.Probe:
    """The GPU idle probe, started with the harness's own interpreter; where it cannot start, the box
    cannot measure a GPU pair honestly: the harness's failure (INFRA_ERROR), never a side's."""
    try:
        probe = device_idle.Probe.start(ctx.ws.python)
    except device_idle.ProbeError as exc:
        raise SideFailed(Failure(Side.HARNESS, "gpu-probe", str(exc))) from exc
    idle = probe.ready.get("idle_ns") or [0]
    ctx.log(
        f"GPU idle probe ready: a round trip on the idle device takes {idle[len(idle) // 2] / 1e3:.0f} µs; "
        f"after every freeze the device must run what the frozen engine left queued, on its clock"
    )
    return probe


def _freeze_notes(procs: Iterable[served.ServedProcess], threads: int | None) -> list[str]:
    """The weaker modes, said where they were used: a box that gives no cgroup v2 freezer, or none that
    can cap an engine's CPU."""
    procs = list(procs)
    notes = []
    if not all(p.freeze_mode == FREEZER for p in procs):
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
    pinned = [p for p in procs if p.pinned]
    if pinned and not all(p.pinned_by == pinning.CPUSET for p in pinned):
        notes.append(
            f"both engines were pinned to CPU {pinning.format_cpu_list(pinned[0].pinned)} by each task's "
            "affinity, which a process can widen, not by a cgroup cpuset this box does not give; every task's "
            "allowed CPUs were checked at each thaw, and none had left"
        )
    return notes


def _clock_notes(run: Run) -> list[str]:
    """The one-part clock, said where it was used: main's engine answers no 'prefill' op."""
    if run.two_part is not False:
        return []
    return [
        "main's engine answers no 'prefill' op, so each request was timed in one part: decode from the "
        "first token line to the last, and an engine could have computed decode steps before its first "
        "token, where only the prefill guard sees them (an engine that lists 'prefill' in its ready line "
        "is timed from a continuation the harness draws after the prefill)"
    ]


def _diagnostics(samples: list[Sample], max_gap: float) -> list[str]:
    """What the harness noticed that decides nothing: the PR's engine's own clock far from the harness's where
    main's agrees (where both disagree, frozen turns and the harness's overheads do, which is no news to a
    reader), and token counts other than streamed."""
    notes = []
    median = {}
    for side in (Side.BASE, Side.HEAD):
        gaps = sorted(g for s in samples if s.side is side and (g := s.self_report_gap) is not None)
        median[side] = (gaps[len(gaps) // 2], len(gaps)) if gaps else None
    head, base = median[Side.HEAD], median[Side.BASE]
    if head and head[0] > max_gap and (base is None or base[0] <= max_gap):
        notes.append(
            f"the PR's engine reports decode times {head[0]:.0%} away from the harness's clock (median over "
            f"{head[1]} requests; main's agree); only the harness's times count"
        )
    for side in (Side.BASE, Side.HEAD):
        wrong_n = sum(1 for s in samples if s.side is side and s.reported_n not in (None, len(s.tokens)))
        if wrong_n:
            notes.append(
                f"{SIDE_LABEL[side]}'s engine reported a token count other than it streamed in {wrong_n} "
                "requests; only the streamed tokens count"
            )
    return notes
