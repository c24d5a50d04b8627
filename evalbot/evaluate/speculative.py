"""Speculative decoding (the n-gram drafter, or the spec pair's draft model) on the harness's clock, on the A/B pairs' warm serving processes.

Lossless means the very tokens that side's plain decode produced. tau, the tokens per step, decides
nothing: one that moved beyond the run-to-run noise is shown as a note.
"""

from __future__ import annotations

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


def spec_rate(side: Side, t: Timed, lossless: bool = True) -> float:
    """A speculative run's rate on the harness's clock, from sending the request to its last token. Where its tokens came in one burst (a rate no
    decode reaches: they were ready before the first was sent), a lossless run fails its side (SideError),
    and a PR's run that is not lossless, which fails the lossless gate anyway, is given its tokens over its
    whole answer instead (an infinite rate is no figure a report or a receipt can carry)."""
    if t.decode_tps < ab_sampling.MAX_DECODE_TPS:
        # tokens over the time from sending the request to its last token: work done before the first token
        # (the whole answer computed up front, its lines spaced out to look like a decode) counts
        return len(t.tokens) / t.to_last_s
    if side is Side.HEAD and not lossless and t.to_last_s > 0:
        return len(t.tokens) / t.to_last_s
    raise ab_samples.BurstError(
        side,
        "serve",
        f"a speculative run's {len(t.tokens)} tokens arrived in {len(t.steps)} line(s) within "
        f"{t.decode_s * 1e6:.0f} µs: a burst, not a decode",
    )


def spec_served(
    ctx: RunContext,
    profile: Profile,
    name: str,
    procs: dict[Side, served.ServedProcess],
    run: ab_samples.Run,
    block: int,
    pool: ab_samples.Prompts,
) -> tuple[list[SpecResult], list[str]]:
    """Speculative decoding on the harness's clock at every scored context. Each run takes a prompt an
    earlier block timed (so these processes never saw it, and nothing can be replayed from a cache),
    and decodes it speculatively on both sides: lossless means the very tokens that side's plain decode
    produced; plain speed comes from those timed requests. Where the requests were timed in two parts,
    each run's plain decode is one request of a fresh prompt instead, laid out as the spec run is.
    Also the notes on tau (diagnostics)."""
    last = run.blocks - 1
    out, notes = [], []
    rules = ctx.ws.rules
    drafter = drafter_for(ctx, profile.name, name)
    for c in profile.contexts:
        if c.ctx not in rules.spec_contexts(profile, name):
            continue
        # as many tokens as the timed requests asked for here: their tokens are the lossless reference
        gen = run.gen.get(c.ctx, profile.measurement.decode_tokens)
        earlier: dict[tuple[int, int], dict[Side, ab_samples.Sample]] = {}
        # a two-part request's tokens follow a continuation token decoded on its own after the prefill; a
        # spec run prefills prompt and token in one batch, whose rounding may flip a near-tie (seen in
        # make demo: an honest head "not lossless" at token 19), so two-part runs are not its reference
        for smp in run.samples if not run.two_part else ():
            if smp.context == c.ctx and smp.block != last:
                earlier.setdefault((smp.block, smp.pair), {})[smp.side] = smp
        runs = spec_run_count(
            rules.spec_runs(profile.name, name), rules.gates.spec.runs, ctx.req.options.max_pairs
        )
        pairs = [v for _, v in sorted(earlier.items()) if len(v) == 2][:runs]
        while len(pairs) < runs:  # too few earlier pairs (a small --max-pairs): plain-decode new prompts here
            pairs.append(_plain_pair(ctx, procs, pool, c.ctx, gen))
        sp: dict[Side, list[float]] = {Side.BASE: [], Side.HEAD: []}
        taus: dict[Side, list[float]] = {Side.BASE: [], Side.HEAD: []}
        steps: dict[Side, list[int]] = {Side.BASE: [], Side.HEAD: []}
        lossless, first_div = 0, None
        for r, pair in enumerate(pairs):
            order = (Side.BASE, Side.HEAD) if r % 2 == 0 else (Side.HEAD, Side.BASE)
            req = {
                "op": "spec",
                "prompt_ids": list(pair[Side.BASE].prompt),  # both sides' plain decode had this prompt
                "max_new": gen,
                "block": block,
                **({"drafter": "draft"} if drafter == "draft" else {"drafter": "ngram", "ngram": 3}),
            }
            while (
                True
            ):  # both sides answer as an A/B pair does: in turns of slice_s where the profile has them
                answers = dict(zip(order, abtest.answer_pair(procs, order, req, ctx.run_timeout_s,
                                                             profile.measurement.slice_s), strict=True))  # fmt: skip
                same = {
                    s: s is Side.BASE or list(t.tokens) == list(pair[s].tokens) for s, t in answers.items()
                }
                try:
                    rates = {s: spec_rate(s, t, same[s]) for s, t in answers.items()}
                except ab_samples.BurstError as exc:  # a stalled reader, once a side (as the A/B pairs)
                    ab_samples.forgive_burst(run, exc, ctx.log, "speculative run")
                    continue
                break
            for side, t in answers.items():
                sp[side].append(rates[side])
                taus[side].append((len(t.tokens) - 1) / max(len(t.steps) - 1, 1))
                steps[side] += [len(step) for step in t.steps[1:]]
            t, ar = answers[Side.HEAD], pair[Side.HEAD]
            if same[Side.HEAD]:
                lossless += 1
            else:
                at = next((i for i, (x, y) in enumerate(zip(ar.tokens, t.tokens, strict=False)) if x != y),
                          min(len(ar.tokens), len(t.tokens)))  # fmt: skip
                first_div = at if first_div is None else min(first_div, at)
        if not pairs:
            continue
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        result = SpecResult(
            target=name,
            drafter="draft " + rules.spec_pair.draft.name if drafter == "draft" else "ngram-3",
            block_size=block,
            runs=len(pairs),
            lossless_runs=lossless,
            first_divergence=first_div,
            base_tau=mean(taus[Side.BASE]),
            head_tau=mean(taus[Side.HEAD]),
            ar_pairs=tuple((pr[Side.BASE].decode_tps, pr[Side.HEAD].decode_tps) for pr in pairs),
            spec_pairs=tuple(zip(sp[Side.BASE], sp[Side.HEAD], strict=True)),
            context=c.ctx,
            base_tau_runs=tuple(taus[Side.BASE]),
            head_tau_runs=tuple(taus[Side.HEAD]),
            base_tau_steps=tuple(steps[Side.BASE]),
            head_tau_steps=tuple(steps[Side.HEAD]),
        )
        out.append(result)
        note = tau_note(result)
        if note:
            notes.append(note)
        ctx.log(
            f"speculative, ctx {c.ctx}: lossless {lossless}/{len(pairs)}, tau {result.base_tau:.2f} -> "
            f"{result.head_tau:.2f}"
        )
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
    return (
        f"speculative tau {way} from {s.base_tau:.2f} to {s.head_tau:.2f} at ctx {s.context} (run-to-run "
        f"noise {noise:.2f}){why}"
    )
