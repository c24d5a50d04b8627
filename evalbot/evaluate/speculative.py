"""Speculative decoding (the n-gram drafter, or the spec pair's draft model) on the harness's clock, on the A/B pairs' warm serving processes.

Lossless means the very tokens that side's plain decode produced. tau, the tokens per step, decides
nothing: one that moved beyond the run-to-run noise is shown as a note.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

from evalbot.evaluate import ab_samples, ab_sampling, abtest, schedule, serve_error, served
from evalbot.evaluate.context import RunContext
from evalbot.evaluate.timed import Timed
from evalbot.model import Side, SpecResult
from evalbot.rules import SPEC_TRACK, Profile


def _plain_pair(
    ctx: RunContext, procs: dict[Side, served.ServedProcess], pool: ab_samples.Prompts, length: int, gen: int
) -> dict[Side, ab_samples.Sample]:
    """Both sides' plain decode of one fresh prompt, as the reference for a speculative run."""
    prompt = pool.next(length)
    out = {}
    for side, p in procs.items():
        others = [q for s, q in procs.items() if s is not side]
        try:
            t = schedule.run_alone(
                p,
                others,
                partial(
                    p.request, {"op": "generate", "prompt_ids": prompt, "max_new": gen}, ctx.run_timeout_s
                ),
            )
        except serve_error.ServeError as exc:
            raise ab_samples.SideError(side, exc.stage, str(exc), exc.tail) from exc
        out[side] = ab_sampling.sample(side, length, -1, 0, prompt, gen, t)
    return out


def drafter_for(ctx: RunContext, profile: str, model: str) -> str:
    """How this model's spec runs draft: 'draft' (the spec pair's draft model, loaded by the target's serving
    engine) where a speculative track says so, or `--spec-drafter draft` asks it for the spec pair's target;
    else 'ngram'."""
    rules, o = ctx.ws.rules, ctx.req.options
    if o.spec_drafter == "draft" and model == rules.spec_pair.target.name:
        return "draft"
    return rules.spec_drafter(profile, model)


def spec_here(ctx: RunContext) -> bool:
    """Whether speculative decoding runs on this evaluation's profile: models.yaml's spec profile, or one a
    speculative track scores."""
    rules, name = ctx.ws.rules, ctx.req.profile.name
    return rules.spec_pair.profile == name or any(t.metric == SPEC_TRACK for t in rules.tracks_for(name))


def drafts(ctx: RunContext) -> bool:
    """Whether any spec run of this evaluation drafts with the spec pair's draft model (so it is fetched)."""
    if not ctx.req.options.spec or not spec_here(ctx):
        return False
    return any(drafter_for(ctx, ctx.req.profile.name, m.name) == "draft" for m in ctx.req.profile.models)


def spec_run_count(asked: int, floor: int, max_pairs: int | None) -> int:
    """Speculative runs per context: the rules' count, within a quick run's pair cap (`--max-pairs`, which
    also bounds the spec runs: each reuses a timed pair's prompt) but never below the gates' floor."""
    return asked if max_pairs is None else max(floor, min(asked, max_pairs))


def spec_rate(side: Side, t: Timed, lossless: bool = True, prefill_s: float = 0.0) -> float:
    """A speculative run's rate on the harness's clock: its tokens over the time from sending the request to
    its last token, less the time to its own first token up to `prefill_s` (main's median prefill at the
    context, `spec_prefill_s`). So the figure is the decode's and not the prompt's (at ctx 512 and 24
    tokens on the CPU, prefill was over half of a run), a faster prefill earns no speculative gain (it is
    spared only as far as it took), and work done before the first token beyond main's prefill (the whole
    answer computed up front, its lines spaced out to look like a decode) counts. Where its tokens came in
    one burst (a rate no decode reaches: they were ready before the first was sent), a lossless run fails
    its side (SideError), and a PR's run that is not lossless, which fails the lossless gate anyway, keeps
    its figure (an infinite rate is no figure a report or a receipt can carry)."""
    if t.decode_tps < ab_sampling.MAX_DECODE_TPS or (side is Side.HEAD and not lossless and t.to_last_s > 0):
        spared = min(t.prefill_s, prefill_s, SPARED * t.to_last_s)
        return len(t.tokens) / (t.to_last_s - max(spared, 0.0))
    raise ab_samples.BurstError(
        side,
        "serve",
        f"a speculative run's {len(t.tokens)} tokens arrived in {len(t.steps)} line(s) within "
        f"{t.decode_s * 1e6:.0f} µs: a burst, not a decode",
    )


# at most this share of a run's time is spared as prefill (a figure stays finite where a run is one burst)
SPARED = 0.8


def spec_prefill_s(samples: list[ab_samples.Sample], c: int) -> float:
    """Main's median prefill time at context c over the A/B's timed requests (0 where none): the most of a
    spec run's time to its first token that is spared. Main is trusted, and the PR cannot move it."""
    xs = sorted(
        s.context / s.prefill_tps
        for s in samples
        if s.side is Side.BASE and s.context == c and s.prefill_tps > 0
    )
    return xs[len(xs) // 2] if xs else 0.0


def hosts(min_blocks: int) -> int:
    """How many blocks the spec runs are spread over: blocks 1 to min_blocks - 1 (block 0 has no earlier
    block whose prompts its processes never saw), each a fresh pair of processes, so no process's offset is
    shared by all the runs; at least one."""
    return max(min_blocks - 1, 1)


def shares(runs: int, host_blocks: int) -> list[int]:
    """Spec runs per block, blocks 0..host_blocks: none in block 0; then half the runs to the odd blocks (the
    PR's process loaded first) and half to the even ones (main's), each half in even shares over its
    blocks, so neither load order carries more runs (the process loaded second decoded about 1% faster on a
    2-core VM: `stats.crossover`). With one host block, all there."""
    out = [0] * (host_blocks + 1)
    odd = list(range(1, host_blocks + 1, 2))
    even = list(range(2, host_blocks + 1, 2))
    halves = [(odd, runs)] if not even else [(odd, (runs + 1) // 2), (even, runs // 2)]
    for blocks, total in halves:
        for i, b in enumerate(blocks):
            out[b] = total // len(blocks) + (1 if i < total % len(blocks) else 0)
    return out


def due_by(block: int, runs: int, host_blocks: int) -> int:
    """Spec runs due by the end of `block` (0-based): the `shares` of blocks 0..block, all of them by the
    last host block."""
    return sum(shares(runs, host_blocks)[: max(block, -1) + 1])


def earlier_pairs(
    samples: list[ab_samples.Sample], c: int, block: int, used: set[tuple[int, int]]
) -> list[tuple[tuple[int, int], dict[Side, ab_samples.Sample]]]:
    """The timed pairs at context c of blocks before `block` (processes since closed, so the block's own
    never saw their prompts) that no spec run used yet, both sides', oldest first."""
    earlier: dict[tuple[int, int], dict[Side, ab_samples.Sample]] = {}
    for smp in samples:
        if smp.context == c and smp.block < block and (smp.block, smp.pair) not in used:
            earlier.setdefault((smp.block, smp.pair), {})[smp.side] = smp
    return [(key, pair) for key, pair in sorted(earlier.items()) if len(pair) == 2]


@dataclass
class _Tally:
    """One context's speculative runs so far."""

    sp: dict[Side, list[float]] = field(default_factory=lambda: {Side.BASE: [], Side.HEAD: []})
    taus: dict[Side, list[float]] = field(default_factory=lambda: {Side.BASE: [], Side.HEAD: []})
    steps: dict[Side, list[int]] = field(default_factory=lambda: {Side.BASE: [], Side.HEAD: []})
    ar: list[tuple[float, float]] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    lossless: int = 0
    first_div: int | None = None
    used: set[tuple[int, int]] = field(default_factory=set)  # (block, pair) of the timed pairs used
    refs: list[tuple[int, dict[Side, ab_samples.Sample]]] = field(default_factory=list)  # (block, plain pair)


class SpecRuns:
    """Speculative decoding on the harness's clock at every context the spec runs measure, spread over the
    A/B's blocks (`in_block`, called at the end of each block with its processes) and finished on the last
    block's (`finish`). Each run decodes, on both sides, a prompt that the processes running it never saw:
    one an earlier block timed, or where requests are timed in two parts (whose prefill rounding may flip a
    near-tie against a one-batch spec prefill), one an earlier block plain-decoded in one request as the
    reference. Lossless means the very tokens that side's plain decode produced; plain speed comes from those
    requests. Spread over blocks, the runs share no one process pair's offset (all on the last block's, the
    offset of one pair of processes went into every run alike)."""

    def __init__(
        self,
        ctx: RunContext,
        profile: Profile,
        name: str,
        block: int,
        pool: ab_samples.Prompts,
    ):
        rules = ctx.ws.rules
        self.ctx, self.profile, self.name, self.block, self.pool = ctx, profile, name, block, pool
        self.drafter = drafter_for(ctx, profile.name, name)
        self.contexts = [c.ctx for c in profile.contexts if c.ctx in rules.spec_contexts(profile, name)]
        self.runs = spec_run_count(rules.spec_runs(profile.name, name), rules.gates.spec.runs,
                                   ctx.req.options.max_pairs)  # fmt: skip
        self.tally = {c: _Tally() for c in self.contexts}

    def in_block(self, block: int, procs: dict[Side, served.ServedProcess], run: ab_samples.Run) -> None:
        """This block's share of the runs, then the plain references the next block's share will lack (all
        of them with two-part requests; with one-part, those the timed pairs so far do not cover), decoded
        here so that the next block's processes never saw those prompts."""
        n = hosts(run.min_blocks)  # the A/B's design (`abtest.measure` sets it)
        for c in self.contexts:
            t = self.tally[c]
            self._runs(c, block, procs, run, due_by(block, self.runs, n) - len(t.blocks))
            if block >= n:
                continue
            need = due_by(block + 1, self.runs, n) - due_by(block, self.runs, n) - len(t.refs)
            if not run.two_part:
                need -= len(earlier_pairs(run.samples, c, block + 1, t.used))
            gen = run.gen.get(c, self.profile.measurement.decode_tokens)
            for _ in range(max(need, 0)):
                t.refs.append((block, self._plain(procs, run, c, gen)))

    def finish(
        self, procs: dict[Side, served.ServedProcess], run: ab_samples.Run
    ) -> tuple[list[SpecResult], list[str]]:
        """The runs still due, on the last block's processes (an A/B that ended before the hosting blocks),
        and the results with the notes on tau (diagnostics)."""
        out, notes = [], []
        last = max(run.blocks - 1, 0)
        for c in self.contexts:
            t = self.tally[c]
            self._runs(c, last, procs, run, self.runs - len(t.blocks))
            if not t.blocks:
                continue
            result = self._result(c, t)
            out.append(result)
            note = tau_note(result)
            if note:
                notes.append(note)
            self.ctx.log(
                f"speculative, ctx {c}: lossless {t.lossless}/{len(t.blocks)} over blocks "
                f"{sorted(set(b + 1 for b in t.blocks))}, tau {result.base_tau:.2f} -> {result.head_tau:.2f}"
            )
        return out, notes

    def _plain(
        self, procs: dict[Side, served.ServedProcess], run: ab_samples.Run, c: int, gen: int
    ) -> dict[Side, ab_samples.Sample]:
        """A plain pair for a spec run's reference, a burst forgiven as an A/B pair's is: measured again on
        another fresh prompt (its figure is the AR speed the gate compares)."""
        while True:
            try:
                return _plain_pair(self.ctx, procs, self.pool, c, gen)
            except ab_samples.BurstError as exc:
                ab_samples.forgive_burst(run, exc, self.ctx.log, "a speculative run's plain reference")

    def _references(
        self, c: int, block: int, procs: dict[Side, served.ServedProcess], run: ab_samples.Run, n: int
    ) -> list[dict[Side, ab_samples.Sample]]:
        """n plain pairs of prompts that an earlier block decoded: its timed pairs (one-part requests), then
        the references decoded ahead. Where too few (an A/B that ended before its hosting blocks), fresh
        prompts plain-decoded here, said in the log: these processes then saw the prompt they run."""
        t = self.tally[c]
        got: list[dict[Side, ab_samples.Sample]] = []
        if not run.two_part:
            for key, pair in earlier_pairs(run.samples, c, block, t.used)[:n]:
                t.used.add(key)
                got.append(pair)
        while t.refs and t.refs[0][0] < block and len(got) < n:
            got.append(t.refs.pop(0)[1])
        gen = run.gen.get(c, self.profile.measurement.decode_tokens)
        if len(got) < n:
            self.ctx.log(
                f"speculative, ctx {c}: {n - len(got)} run(s) plain-decoded by the processes that run them"
            )
        while len(got) < n:
            got.append(self._plain(procs, run, c, gen))
        return got

    def _runs(
        self, c: int, block: int, procs: dict[Side, served.ServedProcess], run: ab_samples.Run, n: int
    ) -> None:
        if n <= 0:
            return
        t = self.tally[c]
        gen = run.gen.get(c, self.profile.measurement.decode_tokens)
        prefill = spec_prefill_s(run.samples, c)
        queue = self._references(c, block, procs, run, n)
        while queue:
            pair = queue.pop(0)
            r = len(t.blocks)
            order = (Side.BASE, Side.HEAD) if r % 2 == 0 else (Side.HEAD, Side.BASE)
            req = {
                "op": "spec",
                "prompt_ids": list(pair[Side.BASE].prompt),  # both sides' plain decode had this prompt
                "max_new": gen,
                "block": self.block,
                **({"drafter": "draft"} if self.drafter == "draft" else {"drafter": "ngram", "ngram": 3}),
            }
            # both sides answer as an A/B pair does: in turns of slice_s where the profile has them
            answers = dict(zip(order, abtest.answer_pair(procs, order, req, self.ctx.run_timeout_s,
                                                         self.profile.measurement.slice_s), strict=True))  # fmt: skip
            for side, a in answers.items():
                # one line per verify step (docs/protocol.md), and a step commits at most `block` tokens (block
                # - 1 drafted and one of its own): more in a line is steps grouped, which would read as a
                # higher tau than the engine's drafts earned. Grouping within the bound is not seen: tau's
                # gate is a guard, the spec rate is clocked by the harness either way.
                wide = max((len(step) for step in a.steps), default=0)
                if wide > self.block:
                    who = "main's" if side is Side.BASE else "the PR's"
                    raise ab_samples.SideError(side, "protocol", f"{who} speculative run streamed {wide} tokens "
                                               f"in one line, where a verify step commits at most {self.block}")  # fmt: skip
            for side, a in answers.items():  # held to the profile's cores, as a timed request is
                why_cpu = ab_sampling.answer_overuse(
                    a, self.profile.measurement.threads, f"a speculative run at ctx {c}"
                )
                if why_cpu:
                    who = "main's" if side is Side.BASE else "the PR's"
                    raise ab_samples.SideError(
                        side, "cpu", f"{who} serving engine used more cores than it may: {why_cpu}"
                    )
            same = {s: s is Side.BASE or list(a.tokens) == list(pair[s].tokens) for s, a in answers.items()}
            try:
                rates = {s: spec_rate(s, a, same[s], prefill) for s, a in answers.items()}
            except ab_samples.BurstError as exc:  # once a side (as the A/B pairs), and measured again on
                # another prompt: these processes have now seen this one, and could replay it
                ab_samples.forgive_burst(run, exc, self.ctx.log, "speculative run")
                queue += self._references(c, block, procs, run, 1)
                continue
            for side, a in answers.items():
                t.sp[side].append(rates[side])
                t.taus[side].append((len(a.tokens) - 1) / max(len(a.steps) - 1, 1))
                t.steps[side] += [len(step) for step in a.steps[1:]]
            t.ar.append((pair[Side.BASE].decode_tps, pair[Side.HEAD].decode_tps))
            t.blocks.append(block)
            a, ar = answers[Side.HEAD], pair[Side.HEAD]
            if same[Side.HEAD]:
                t.lossless += 1
            else:
                at = next((i for i, (x, y) in enumerate(zip(ar.tokens, a.tokens, strict=False)) if x != y),
                          min(len(ar.tokens), len(a.tokens)))  # fmt: skip
                t.first_div = at if t.first_div is None else min(t.first_div, at)

    def _result(self, c: int, t: _Tally) -> SpecResult:
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        rules = self.ctx.ws.rules
        return SpecResult(
            target=self.name,
            drafter="draft " + rules.spec_pair.draft.name if self.drafter == "draft" else "ngram-3",
            block_size=self.block,
            runs=len(t.blocks),
            lossless_runs=t.lossless,
            first_divergence=t.first_div,
            base_tau=mean(t.taus[Side.BASE]),
            head_tau=mean(t.taus[Side.HEAD]),
            ar_pairs=tuple(t.ar),
            spec_pairs=tuple(zip(t.sp[Side.BASE], t.sp[Side.HEAD], strict=True)),
            context=c,
            base_tau_runs=tuple(t.taus[Side.BASE]),
            head_tau_runs=tuple(t.taus[Side.HEAD]),
            base_tau_steps=tuple(t.steps[Side.BASE]),
            head_tau_steps=tuple(t.steps[Side.HEAD]),
            spec_blocks=tuple(t.blocks),
        )


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
    return (
        f"speculative tau {way} from {s.base_tau:.2f} to {s.head_tau:.2f} at ctx {s.context} (run-to-run "
        f"noise {noise:.2f}){why}"
    )
