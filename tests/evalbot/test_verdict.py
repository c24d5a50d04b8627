"""verdict.decide: gates, tiers from the CI lower bound, INFRA_ERROR vs REJECT, labels as set differences."""

from __future__ import annotations

import math
import random

import pytest

from evalbot import stats
from evalbot import verdict as verdict_mod
from evalbot.model import (
    AccuracyResult,
    DecodeAudit,
    Failure,
    Measurements,
    Provenance,
    Side,
    SpecResult,
    Status,
    ThroughputPairs,
)
from evalbot.rules import LabelFamily, default_rules_dir, load_rules
from evalbot.verdict.decide import decide
from evalbot.verdict.gates import (
    FAIL,
    OPEN,
    PASS,
    audit_bar,
    audit_call,
    share_difference,
    spec_gates,
    spec_slowdown_proven,
    spec_unresolved,
    tau_ratio_upper,
    wilson,
)


@pytest.fixture(scope="module")
def rules():
    return load_rules(default_rules_dir())


PROV = Provenance("repo", "a" * 40, "b" * 40, "a" * 40, "0" * 64, "cpu")


def pairs(ratio: float, n: int = 12, noise: float = 0.004, seed: int = 0) -> tuple[tuple[float, float], ...]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        drift = 100 * (1 + 0.01 * i)  # slow drift that the pairing cancels
        out.append((drift * (1 + rng.gauss(0, noise)), drift * ratio * (1 + rng.gauss(0, noise))))
    return tuple(out)


def meas(*tps, accuracy=(), spec=(), failures=(), skipped=None) -> Measurements:
    return Measurements(
        PROV, throughput=tps, accuracy=accuracy, spec=spec, failures=failures, skipped_reason=skipped
    )


def tp(ctx: int, ratio: float, **kw) -> ThroughputPairs:
    return ThroughputPairs("qwen2.5-coder-0.5b", ctx, "decode_tps", pairs(ratio, seed=ctx, **kw))


GOOD_ACC = AccuracyResult("qwen2.5-coder-0.5b", 512, 0.99, 0.001, 1.0005)


def test_clear_gain_gets_its_tier_and_verified(rules):
    v = decide(meas(tp(128, 1.0), tp(512, 1.05), accuracy=(GOOD_ACC,)), rules)
    assert v.status == Status.PASS and v.tier == "S" and v.scored_context == 512
    assert set(v.labels_add) == {"verified", "perf:S"}
    assert set(v.labels_add) <= rules.owned(LabelFamily.VERDICT)  # the family's others are taken off
    assert v.mde is not None and 0 < v.mde < 0.02
    assert v.rules_hash == rules.rules_hash


def test_a_ci_straddling_a_boundary_gets_the_lower_tier(rules):
    # a 3.8% point estimate with noise wide enough that the lower bound sits under S's 3.5%
    v = decide(meas(tp(512, 1.038, noise=0.01, n=8)), rules)
    est = v.estimates[0]
    assert est.ratio > 1.035 and est.ci_low < 1.035
    assert v.tier == "XS"


def test_noise_alone_earns_nothing(rules):
    v = decide(meas(tp(128, 1.0), tp(512, 1.0)), rules)
    assert v.status == Status.PASS and v.tier is None and "perf:XS" not in v.labels_add


def test_a_guarded_regression_rejects_even_with_a_tier_elsewhere(rules):
    v = decide(meas(tp(128, 0.95), tp(512, 1.05)), rules)
    assert v.status == Status.REJECT and v.tier is None
    assert "regression" in v.labels_add and "verified" not in v.labels_add
    failing = [g for g in v.gates if not g.passed]
    assert [g.context for g in failing] == [128]
    assert any("-5" in r or "0.95" in r for r in v.reasons)  # the measured delta is shown, not "+0.0%"


def test_a_small_noisy_dip_is_not_a_regression(rules):
    v = decide(meas(tp(128, 0.99, noise=0.02, n=6)), rules)
    assert v.status == Status.PASS


def test_accuracy_failure_rejects(rules):
    bad = AccuracyResult("qwen2.5-coder-0.5b", 512, 0.71, 0.34, 1.2)
    v = decide(meas(tp(512, 1.05), accuracy=(bad,)), rules)
    assert v.status == Status.REJECT and "accuracy-fail" in v.labels_add
    assert {g.name for g in v.gates if not g.passed} == {"accuracy top-1", "accuracy KL"}


def test_lossy_speculation_rejects(rules):
    s = SpecResult("qwen2.5-coder-1.5b", "draft-model", 7, 3, 2, 17, 3.5, 3.6, pairs(1.0), pairs(1.3))
    v = decide(meas(tp(512, 1.0), spec=(s,)), rules)
    assert v.status == Status.REJECT and "spec-fail" in v.labels_add
    assert any("first divergence at token 17" in r for r in v.reasons)


def test_lower_acceptance_rejects(rules):
    s = SpecResult("qwen2.5-coder-1.5b", "draft-model", 7, 3, 3, None, 3.5, 3.0, pairs(1.0), pairs(1.0))
    v = decide(meas(tp(512, 1.0), spec=(s,)), rules)
    assert [g.name for g in v.gates if not g.passed] == ["spec tau"]


def _steps(counts: dict[int, int]) -> tuple[int, ...]:
    """Verify steps committing k tokens, n times each."""
    return tuple(k for k, n in sorted(counts.items()) for _ in range(n))


def _ngram_spec(base: tuple[int, ...], head: tuple[int, ...], head_tau: float) -> SpecResult:
    """Lossless n-gram speculation at ctx 512 (3 of 3 runs), main's tau 1.54, with these verify steps."""
    return SpecResult(
        "qwen2.5-coder-0.5b",
        "ngram-3",
        7,
        3,
        3,
        None,
        1.54,
        head_tau,
        pairs(1.0),
        pairs(1.0),
        context=512,
        base_tau_steps=base,
        head_tau_steps=head,
    )


def test_tau_moved_by_the_text_a_pr_writes_is_not_a_rejection(rules):
    """The demo's int8 patch, 2026-12-04: lossless, its outputs a little different from main's, so its
    n-gram drafter hit a little less (tau 1.43 against 1.53 over 3 runs). A point estimate against the 5%
    bar rejected it; the bound over the verify steps does not."""
    base = _steps({1: 32, 2: 9, 3: 4, 4: 2, 6: 1})  # 48 steps, tau 1.54
    head = _steps({1: 35, 2: 9, 3: 3, 4: 1, 6: 1})  # 49 steps, tau 1.43
    s = _ngram_spec(base, head, 1.43)
    v = decide(meas(tp(512, 1.0), spec=(s,)), rules)
    gate = next(g for g in v.gates if g.name == "spec tau")
    assert gate.passed and gate.value > 0.95 and "1.43 vs main 1.54" in gate.detail
    assert v.status == Status.PASS


def test_a_drafter_that_never_hits_is_rejected_on_the_bound(rules):
    """Every verify step commits one token (verification that rejects every draft): the bound is far
    below 0.95 of main's, and the PR is rejected naming the gate."""
    base = _steps({1: 32, 2: 9, 3: 4, 4: 2, 6: 1})
    head = (1,) * 69
    s = _ngram_spec(base, head, 1.0)
    v = decide(meas(tp(512, 1.0), spec=(s,)), rules)
    assert v.status == Status.REJECT and [g.name for g in v.gates if not g.passed] == ["spec tau"]
    assert tau_ratio_upper(base, head) < 0.85


def test_the_tau_bound(rules):
    assert tau_ratio_upper((), (1, 2)) is None and tau_ratio_upper((1,), (1, 2)) is None
    assert tau_ratio_upper((2, 2, 2), (2, 2, 2)) == 1.0  # no spread: the ratio itself
    wide, narrow = tau_ratio_upper((1, 3) * 5, (1, 3) * 5), tau_ratio_upper((1, 3) * 50, (1, 3) * 50)
    assert wide > narrow > 1.0  # more steps, a tighter bound


def test_main_failing_too_is_infra_not_the_contributor(rules):
    f = (Failure(Side.BASE, "build", "pip failed"), Failure(Side.HEAD, "build", "pip failed"))
    v = decide(meas(failures=f), rules)
    assert v.status == Status.INFRA_ERROR and v.labels_add == ("infra-error",)


@pytest.mark.parametrize("stage", ["toolchain", "gpu", "sandbox"])
def test_environment_failures_on_the_head_are_infra(rules, stage):
    v = decide(meas(failures=(Failure(Side.HEAD, stage, "boom"),)), rules)
    assert v.status == Status.INFRA_ERROR


def test_head_build_failure_alone_rejects(rules):
    v = decide(meas(failures=(Failure(Side.HEAD, "build", "SyntaxError in engine/model.py"),)), rules)
    assert v.status == Status.REJECT and "SyntaxError" in v.reasons[0]


def test_skipped(rules):
    v = decide(meas(skipped="changes sensitive paths: rules/gates.yaml"), rules)
    assert v.status == Status.SKIPPED and v.reasons == ("changes sensitive paths: rules/gates.yaml",)


def test_too_few_pairs_is_infra(rules):
    one = ThroughputPairs("m", 128, "decode_tps", ((1.0, 1.0),))
    assert decide(meas(one), rules).status == Status.INFRA_ERROR
    assert decide(meas(), rules).status == Status.INFRA_ERROR


@pytest.mark.parametrize("case", ["regression", "accuracy", "infra", "pass"])
def test_decided_verdicts_render(rules, case):
    from evalbot.render import MARKER, find_state, render_comment

    m = {
        "regression": meas(tp(128, 0.95), tp(512, 1.05)),
        "accuracy": meas(tp(512, 1.05), accuracy=(AccuracyResult("m", 512, 0.71, 0.34, 1.2),)),
        "infra": meas(failures=(Failure(Side.BASE, "build", "pip: `resolver` </details> @here"),)),
        "pass": meas(tp(128, 1.0), tp(512, 1.05), accuracy=(GOOD_ACC,)),
    }[case]
    v = decide(m, rules)
    text = render_comment(v, m, signature_status="unsigned")
    assert text.startswith(MARKER) and "unsigned" in text
    assert find_state(text)["status"] == v.status.value
    assert "+0.0%" not in text
    assert "@here" not in text  # mentions are neutralized
    if case == "regression":
        assert "REJECT" in text and ("-4." in text or "-5." in text)


def _audit(side, ctx, tokens=64, agree=64, ties=0, violations=0, worst=()):
    return DecodeAudit(
        "qwen2.5-coder-0.5b", ctx, side, "llama.cpp", 4, tokens, agree, ties, violations, worst
    )


def test_the_decode_audit_rejects_tokens_the_reference_does_not_produce(rules):
    honest = (_audit(Side.BASE, 512), _audit(Side.HEAD, 512, agree=62, ties=2))
    v = decide(
        Measurements(PROV, throughput=(tp(128, 1.05), tp(512, 1.05)), accuracy=(GOOD_ACC,), audits=honest),
        rules,
    )
    assert v.status == Status.PASS and any(g.name == "decode agreement" and g.passed for g in v.gates)
    worst = ({"request": "head-ctx512-b2-p3", "position": 7, "token": 5, "reference": 9, "margin": 4.2},)
    shortcut = (_audit(Side.BASE, 512), _audit(Side.HEAD, 512, agree=40, ties=1, violations=23, worst=worst))
    v = decide(
        Measurements(PROV, throughput=(tp(128, 1.30), tp(512, 1.30)), accuracy=(GOOD_ACC,), audits=shortcut),
        rules,
    )
    assert v.status == Status.REJECT and v.tier is None and rules.labels.accuracy_fail in v.labels_add
    gate = next(g for g in v.gates if g.name == "decode agreement")
    assert (
        gate.context == 512 and "head-ctx512-b2-p3 position 7" in gate.detail and "margin 4.20" in gate.detail
    )
    one_bad = (_audit(Side.BASE, 512), _audit(Side.HEAD, 512, agree=63, violations=1, worst=worst))
    assert (
        decide(Measurements(PROV, throughput=(tp(512, 1.05),), audits=one_bad), rules).status == Status.REJECT
    )


def test_main_failing_the_decode_audit_is_an_infra_error(rules):
    audits = (
        _audit(Side.BASE, 512, agree=30, violations=34),
        _audit(Side.HEAD, 512, agree=30, violations=34),
    )
    v = decide(Measurements(PROV, throughput=(tp(512, 1.05),), audits=audits), rules)
    assert v.status == Status.INFRA_ERROR and "main fails the decode audit too" in v.reasons[0]


def _self_audit(side, agree, ties, violations=0, ctx=4096):
    return DecodeAudit("qwen3-1.7b", ctx, side, "main", 4, 256, agree, ties, violations, ())


def test_where_main_is_the_reference_its_own_share_sets_the_bar(rules):
    """Random weights in bf16 (the H200 smoke run): main teacher-forced against itself agreed on 236 of 256
    tokens, every other one a near-tie. That is the harness working, not failing; the head is held to it."""
    g = rules.gates.decode_audit
    main = _self_audit(Side.BASE, 236, 20)
    ok = decide(
        Measurements(PROV, throughput=(tp(4096, 1.05),), audits=(main, _self_audit(Side.HEAD, 240, 16))),
        rules,
    )
    gate = next(x for x in ok.gates if x.name == "decode agreement")
    assert ok.status == Status.PASS and gate.passed and "main's own share" in gate.bar
    # a head that skips work: far below main's own share, even with every disagreement a near-tie
    drop = 190  # 74% against main's 92%: the interval of the change is about -25 to -11 points
    lazy = decide(
        Measurements(
            PROV, throughput=(tp(4096, 1.30),), audits=(main, _self_audit(Side.HEAD, drop, 256 - drop))
        ),
        rules,
    )
    assert lazy.status == Status.REJECT and lazy.tier is None
    # one disagreement beyond a near-tie still fails, whatever the shares
    assert (
        decide(
            Measurements(
                PROV, throughput=(tp(4096, 1.05),), audits=(main, _self_audit(Side.HEAD, 240, 15, 1))
            ),
            rules,
        ).status
        == Status.REJECT
    )
    # main far from itself: the harness is off, nobody's PR
    broken = _self_audit(Side.BASE, int(256 * g.self_top1_min) - 1, 256 - int(256 * g.self_top1_min) + 1)
    v = decide(
        Measurements(PROV, throughput=(tp(4096, 1.05),), audits=(broken, _self_audit(Side.HEAD, 240, 16))),
        rules,
    )
    assert v.status == Status.INFRA_ERROR and "main fails the decode audit too" in v.reasons[0]
    # against llama.cpp with main at 100%, the absolute bar stays: 215/256 is too few
    llama = (_audit(Side.BASE, 512), _audit(Side.HEAD, 512, tokens=256, agree=215, ties=41))
    assert (
        decide(
            Measurements(PROV, throughput=(tp(512, 1.05),), accuracy=(GOOD_ACC,), audits=llama), rules
        ).status
        == Status.REJECT
    )


def test_the_headline_and_the_lower_bound_are_computed_once_and_survive_the_store(rules):
    """decide sets them; whatever a caller or a stored record claims is replaced by what the estimates say."""
    import dataclasses

    from evalbot.codec import from_dict, to_dict
    from evalbot.model import Verdict

    v = decide(meas(tp(128, 1.0), tp(512, 1.05), accuracy=(GOOD_ACC,)), rules)
    at512 = next(e for e in v.estimates if e.context == 512)
    assert v.headline == at512 and v.lower_bound_gain == pytest.approx(at512.ci_low - 1)
    forged = to_dict(v) | {"lower_bound_gain": 0.5, "headline": to_dict(v.estimates[0])}
    back = from_dict(Verdict, forged)
    assert back.lower_bound_gain == v.lower_bound_gain and back.headline == at512 and back == v
    assert dataclasses.replace(v, lower_bound_gain=9.0).lower_bound_gain == v.lower_bound_gain
    rejected = decide(meas(tp(128, 1.2), tp(512, 0.9), accuracy=(GOOD_ACC,)), rules)
    assert (
        rejected.status is Status.REJECT and rejected.headline.context == 512 and rejected.headline.regression
    )


def test_gates_are_matched_by_kind_never_by_their_display_name(rules):
    from evalbot.model import Gate, GateKind

    v = decide(
        meas(
            tp(128, 1.0), tp(512, 0.9), accuracy=(AccuracyResult("qwen2.5-coder-0.5b", 512, 0.5, 0.4, 1.3),)
        ),
        rules,
    )
    kinds = {g.name: g.kind for g in v.gates}
    assert kinds["no regression"] is GateKind.REGRESSION and kinds["accuracy top-1"] is GateKind.ACCURACY
    assert {"regression", "accuracy-fail"} <= set(v.labels_add)
    # a verdict stored before gates had kinds reads its kind from the name, once; an unknown name is refused
    assert Gate("spec tau", 1.0, "bar", True).kind is GateKind.SPEC
    with pytest.raises(ValueError, match="no kind given"):
        Gate("something new", 1.0, "bar", True)


def test_spec_gates_carry_their_context_and_the_report_shows_each_row_its_own(rules):
    """Spec runs at every scored context: a failure names its context, and the report's row for ctx 512
    never shows ctx 128's bars (the demo showed both under each row)."""
    from evalbot import render

    at128 = SpecResult(
        "qwen2.5-coder-0.5b", "ngram-3", 7, 3, 3, None, 1.28, 1.52, pairs(1.0), pairs(1.2), context=128
    )
    at512 = SpecResult(
        "qwen2.5-coder-0.5b", "ngram-3", 7, 3, 2, 9, 1.61, 1.61, pairs(1.0), pairs(1.0), context=512
    )
    m = meas(tp(128, 1.0), tp(512, 1.0), accuracy=(GOOD_ACC,), spec=(at128, at512))
    v = decide(m, rules)
    spec = [(g.name, g.context, g.passed) for g in v.gates if g.name.startswith("spec")]
    assert ("spec lossless", 512, False) in spec and ("spec lossless", 128, True) in spec
    assert v.status is Status.REJECT and any("spec lossless at ctx 512 failed" in r for r in v.reasons)
    rows = render._context(v, m, "unsigned")["spec"]
    assert [[g.context for g in row["gates"]] for row in rows] == [
        [128] * 4,
        [512] * 4,
    ]  # lossless, tau, AR, speed


def test_against_llama_cpp_main_below_the_bar_on_near_ties_sets_it_for_the_head(rules):
    """The cpu profile's A/A calibration on this box: main agreed with llama.cpp on 364 of 384 decoded
    tokens (94.8%), every other one a near-tie. Identical code is no infra error; the head is held to main."""
    g = rules.gates.decode_audit
    main = _audit(Side.BASE, 128, tokens=384, agree=364, ties=20)
    same = decide(
        Measurements(
            PROV,
            throughput=(tp(128, 1.0), tp(512, 1.0)),
            accuracy=(GOOD_ACC,),
            audits=(main, _audit(Side.HEAD, 128, tokens=384, agree=362, ties=22)),
        ),
        rules,
    )
    assert same.status is not Status.INFRA_ERROR
    gate = next(x for x in same.gates if x.name == "decode agreement")
    assert gate.passed and "main's own share" in gate.bar
    # a head far below main's share fails, even with every disagreement a near-tie (the interval of its
    # change against main's: about -19 to -9 points, wholly past the allowed drop)
    drop = int(384 * (364 / 384 - 2.8 * g.self_drop_max))
    lazy = decide(
        Measurements(
            PROV,
            throughput=(tp(128, 1.3), tp(512, 1.3)),
            accuracy=(GOOD_ACC,),
            audits=(main, _audit(Side.HEAD, 128, tokens=384, agree=drop, ties=384 - drop)),
        ),
        rules,
    )
    assert lazy.status == Status.REJECT and lazy.tier is None


def test_the_accuracy_gate_names_the_reference_it_was_held_to():
    """#38: the reference is evalbot's llama.cpp, or a main's own where llama.cpp cannot run the model: the
    gate says which, as its score record names it."""
    from evalbot.model import AccuracyResult
    from evalbot.verdict.gates import accuracy_gates

    rules = load_rules(default_rules_dir())
    (ours,) = [
        g for g in accuracy_gates([AccuracyResult("m", 128, 0.99, 0.01, 1.0)], rules) if "top-1" in g.name
    ]
    assert ours.bar.endswith("vs llama.cpp")
    theirs = AccuracyResult("m", 128, 0.99, 0.01, 1.0, reference="float64 reference")
    (gate,) = [g for g in accuracy_gates([theirs], rules) if "top-1" in g.name]
    assert gate.bar.endswith("vs float64 reference") and "llama" not in gate.bar


def test_wilson_and_newcombe_match_the_published_figures():
    # Newcombe (1998), Statistics in Medicine 17:873, table II: 56/70 against 48/80, method 10
    lo, hi = share_difference(56, 70, 48, 80, 1.959964)
    assert (round(lo, 4), round(hi, 4)) == (0.0524, 0.3339)
    lo, hi = wilson(81, 263, 1.959964)  # Wilson (1927) as in Newcombe's table I: 0.2553 to 0.3662
    assert (round(lo, 4), round(hi, 4)) == (0.2553, 0.3662)
    assert wilson(0, 0, 1.96) == (0.0, 1.0) and wilson(10, 10, 1.96)[1] == 1.0


def test_a_few_requests_that_cannot_tell_do_not_reject_and_enough_tokens_do(rules):
    """`make demo`'s int8 PR, 2026-12-07: 127 of 136 tokens against main's 135 of 136, every other one a
    near-tie, a drop of 5.9 points by the counts over a bar of 5. Its four requests cannot tell: the gate
    is open and passes. A larger drop over 10x the tokens (every timed request audited) is told."""
    g = rules.gates.decode_audit
    main, head = _audit(Side.BASE, 128, 136, 135, 1), _audit(Side.HEAD, 128, 136, 127, 9)
    assert audit_bar(head, (main, head), rules) == pytest.approx(135 / 136 - g.self_drop_max)
    assert head.share < audit_bar(head, (main, head), rules)  # below the bar by the counts
    assert audit_call(head, (main, head), rules) == OPEN
    v = decide(
        Measurements(PROV, throughput=(tp(128, 1.05),), accuracy=(GOOD_ACC,), audits=(main, head)), rules
    )
    gate = next(x for x in v.gates if x.name == "decode agreement")
    assert v.status == Status.PASS and gate.passed and "interval" in gate.bar and "a change of" in gate.detail
    # ten times the tokens at the same shares: a drop of 5.9 points where 5 are allowed is still too close
    # to call; a drop of 9.6 points is not
    main10 = _audit(Side.BASE, 128, 1360, 1350, 10)
    assert audit_call(_audit(Side.HEAD, 128, 1360, 1270, 90), (main10,), rules) == OPEN
    head10 = _audit(Side.HEAD, 128, 1360, 1220, 140)
    assert audit_call(head10, (main10, head10), rules) == FAIL
    v = decide(
        Measurements(PROV, throughput=(tp(128, 1.05),), accuracy=(GOOD_ACC,), audits=(main10, head10)), rules
    )
    assert v.status == Status.REJECT
    # a head as good as main passes outright; one confidently above the absolute bar too
    assert audit_call(_audit(Side.HEAD, 128, 136, 134, 2), (main, head), rules) == PASS
    assert audit_call(_audit(Side.HEAD, 128, 2000, 1990, 10), (), rules) == PASS


def test_a_lazy_decode_that_flips_only_near_ties_cannot_hide_in_the_interval(rules):
    """What a contributor might try: skip work so that only close calls flip (every disagreement a
    near-tie), at a rate the interval of a few requests would excuse. Widened to every timed request (a
    real evaluation's 16-24 a context, ~35 tokens each), a tenth of the tokens flipped fails."""
    main, lazy = _audit(Side.BASE, 512, 700, 693, 7), _audit(Side.HEAD, 512, 700, 630, 70)
    assert audit_call(lazy, (main, lazy), rules) == FAIL
    few_main, few_lazy = _audit(Side.BASE, 512, 136, 135, 1), _audit(Side.HEAD, 512, 136, 122, 14)
    assert audit_call(few_lazy, (few_main, few_lazy), rules) == OPEN  # so the audit is widened first


def test_an_open_audit_is_widened_to_every_timed_request_at_its_context_only():
    from evalbot.evaluate import audit
    from evalbot.evaluate.ab_samples import Sample

    def s(side, ctx, block, pair):
        return Sample(side, ctx, block, pair, (1, 2), (3, 4), 1.0, 1.0, {})

    samples = [
        s(side, c, b, p)
        for c in (128, 512)
        for b in range(2)
        for p in range(3)
        for side in (Side.BASE, Side.HEAD)
    ]
    chosen = audit.choose(samples, rng_seed=7, share=0.25, minimum=4)
    more = audit.widen(samples, chosen, {512})
    assert {x.context for x in more} == {512}
    assert len(more) + sum(x.context == 512 for x in chosen) == 12  # 6 pairs, both sides: all of them
    assert not {(x.block, x.pair, x.side) for x in more} & {
        (x.block, x.pair, x.side) for x in chosen if x.context == 512
    }
    assert audit.widen(samples, chosen, set()) == []


def test_a_rare_flip_a_little_past_a_near_tie_is_weighed_and_one_far_past_it_fails(rules):
    """`make demo`'s int8 PR (2026-12-07): 133 of 140 tokens at ctx 512 agreed with llama.cpp, 6 near-ties
    and one flip 1.07 below the top-1, against main's 139 of 140 and none. A lossy decode flips a rare
    token a little past a near-tie; one past max_gap (no decode of the accepted quality emits it greedily)
    still fails at once, as does a head that flips past a near-tie confidently more often than main."""
    g = rules.gates.decode_audit
    assert g.near_tie < 1.07 < g.max_gap
    flip = ({"request": "head-ctx512-b4-p1", "position": 2, "token": 5, "reference": 9, "margin": 1.07},)
    main = _audit(Side.BASE, 512, 140, 139, 1)
    head = _audit(Side.HEAD, 512, 140, 133, 6, violations=1, worst=flip)
    assert audit_call(head, (main, head), rules) == OPEN  # widened first; passes if it stays so
    v = decide(
        Measurements(PROV, throughput=(tp(512, 1.05),), accuracy=(GOOD_ACC,), audits=(main, head)), rules
    )
    assert (
        v.status == Status.PASS and "within 3" in next(x for x in v.gates if x.name == "decode agreement").bar
    )
    far = ({**flip[0], "margin": g.max_gap + 0.01},)
    assert audit_call(_audit(Side.HEAD, 512, 140, 133, 6, violations=1, worst=far), (main,), rules) == FAIL
    unnamed = _audit(Side.HEAD, 512, 140, 133, 6, violations=1)  # a count with no gap to weigh: fails
    assert audit_call(unnamed, (main,), rules) == FAIL
    many = _audit(Side.HEAD, 512, 140, 126, 2, violations=12, worst=flip)  # 12 mild flips against none
    assert audit_call(many, (main,), rules) == FAIL
    assert audit_call(head, (), rules) == FAIL  # with no main audit to weigh it against: as before
    # main's own mild flip against llama.cpp is no infra error; one far past max_gap is
    assert audit_call(_audit(Side.BASE, 512, 140, 138, 1, violations=1, worst=flip), (), rules) == PASS
    assert audit_call(_audit(Side.BASE, 512, 140, 138, 1, violations=1, worst=far), (), rules) == FAIL


def test_without_max_gap_every_flip_past_a_near_tie_fails_as_before(rules_dir):
    from evalbot.rules import load_rules as load

    path = rules_dir / "gates.yaml"
    path.write_text("".join(line for line in path.read_text().splitlines(True) if "max_gap:" not in line))
    rules = load(rules_dir)
    assert rules.gates.decode_audit.max_gap is None
    flip = ({"request": "head-ctx512-b4-p1", "position": 2, "token": 5, "reference": 9, "margin": 1.07},)
    main = _audit(Side.BASE, 512, 140, 139, 1)
    assert audit_call(_audit(Side.HEAD, 512, 140, 133, 6, violations=1, worst=flip), (main,), rules) == FAIL


def test_speculative_decoding_made_slower_at_equal_tau_and_ar_speed_is_a_regression(rules):
    """A PR that keeps the drafts and the plain decode as they were but verifies them slower (a draft
    block run token by token, say): the spec track reads 0.70x. Before, only tau, the AR speed and
    losslessness were gated, so nothing caught it."""
    base_steps = _steps({1: 32, 2: 9, 3: 4, 4: 2, 6: 1})

    def spec(ratio: float, noise: float, n: int = 16) -> SpecResult:
        return SpecResult("qwen2.5-coder-0.5b", "ngram-3", 7, n, n, None, 1.54, 1.54, pairs(1.0),
                          pairs(ratio, n=n, noise=noise, seed=5), context=512,
                          base_tau_steps=base_steps, head_tau_steps=base_steps)  # fmt: skip

    slow = decide(meas(tp(512, 1.0), accuracy=(GOOD_ACC,), spec=(spec(0.70, 0.05),)), rules)
    gate = next(g for g in slow.gates if g.name == "spec speed")
    assert slow.status == Status.REJECT and not gate.passed and "spec-fail" in slow.labels_add
    assert [g.name for g in slow.gates if not g.passed] == ["spec speed"] and gate.detail.startswith(
        "spec 0.6"
    )
    # equal code, and a dip the runs cannot resolve: the gate passes (noise is no regression)
    for ratio, noise in ((1.0, 0.15), (0.93, 0.15)):
        v = decide(meas(tp(512, 1.0), accuracy=(GOOD_ACC,), spec=(spec(ratio, noise, 8),)), rules)
        g = next(g for g in v.gates if g.name == "spec speed")
        assert g.passed and v.status == Status.PASS, (ratio, g)
    # the rule: the bound below the bar by an MDE, as a decode regression's
    est = verdict_mod.spec_estimates((spec(0.90, 0.15, 8),), rules)[0]
    assert spec_slowdown_proven(est, rules) == (est.ci_high < 0.98 and est.ci_high * (1 + est.mde) <= 1.0)


def test_the_spec_ar_gate_calls_a_slowdown_as_a_decode_regression_is_called(rules):
    """Equal code on a noisy box: the AR pairs' bound below 0.98 by chance, but not by an MDE (the rule a
    decode regression is called by), is no REJECT; a slowdown they resolve is."""
    base_steps = _steps({1: 32, 2: 9, 3: 4, 4: 2, 6: 1})

    def spec(ar: tuple[tuple[float, float], ...]) -> SpecResult:
        return SpecResult("qwen2.5-coder-0.5b", "ngram-3", 7, 6, 6, None, 1.54, 1.54, ar, pairs(1.0, n=6),
                          context=512, base_tau_steps=base_steps, head_tau_steps=base_steps)  # fmt: skip

    # six pairs at 6% spread whose mean reads 0.93x: bound 0.978, MDE 7%
    noisy = tuple((100.0, 100.0 * math.exp(-0.072 + 0.06 * z)) for z in (-1.3, -0.5, 0.0, 0.4, 0.9, 0.5))
    e = stats.estimate(noisy)
    assert e.ci_high < 0.98 and e.ci_high * (1 + e.mde) > 1.0
    gate = next(g for g in spec_gates([spec(noisy)], rules) if g.name == "spec AR speed")
    assert gate.passed and gate.value < 0.98
    slow = next(g for g in spec_gates([spec(pairs(0.95, n=12))], rules) if g.name == "spec AR speed")
    assert not slow.passed


def test_the_audits_edges_found_by_review_fail_closed(rules):
    """NaN or unsorted gaps, counts that do not add up, no tokens: none passes. And the int8 rate of flips
    (1 in 344) over a GPU profile's 4,096 audited tokens is allowed, where four flips against none failed."""
    main = _audit(Side.BASE, 512, 140, 139, 1)
    mild = {"request": "head-ctx512-b1-p1", "position": 2, "token": 5, "reference": 9, "margin": 1.07}
    far = {**mild, "margin": 10.0}
    for worst in (
        (far, mild),
        (mild, far),
        ({**mild, "margin": float("nan")},),
        ({**mild, "margin": "1.5"},),
    ):
        assert (
            audit_call(
                _audit(Side.HEAD, 512, 140, 133, 5, violations=len(worst), worst=worst), (main,), rules
            )
            == FAIL
        )
    assert audit_call(_audit(Side.HEAD, 512, 0, 0, 0), (main,), rules) == FAIL
    assert (
        audit_call(_audit(Side.HEAD, 512, 140, 150, 0), (main,), rules) == FAIL
    )  # more agreeing than tokens
    assert (
        audit_call(
            _audit(Side.BASE, 512, 140, 138, 1, violations=1, worst=({**mild, "margin": float("nan")},)),
            (),
            rules,
        )
        == FAIL
    )
    big_main = _audit(Side.BASE, 4096, 4096, 4060, 36)
    int8 = _audit(Side.HEAD, 4096, 4096, 4020, 64, violations=12, worst=(mild,) * 10)
    assert audit_call(int8, (big_main,), rules) != FAIL
    lazy = _audit(Side.HEAD, 4096, 4096, 3900, 76, violations=120, worst=(mild,) * 10)  # 2.9% flips
    assert audit_call(lazy, (big_main,), rules) == FAIL


def test_a_nan_gap_from_the_reference_is_a_violation_past_any_max_gap():
    from evalbot.evaluate import audit
    from evalbot.evaluate.ab_samples import Sample

    s = Sample(Side.HEAD, 128, 0, 0, (1, 2), (7, 8), 1.0, 1.0, {})
    answers = {audit.key(s): {"argmax": [7, 9], "margin": [0.2, float("nan")], "gap": [0.0, float("nan")]}}
    [a] = audit.judge("m", "main", [s], answers, near_tie=1.0)
    assert a.violations == 1 and a.worst[0]["margin"] == float("inf")


def test_a_spec_slowdown_hidden_in_noise_of_the_prs_own_making_is_measured_again(rules):
    """Review's attack (2026-12-07): a PR sleeps at random in its spec op only, so a 0.67x speculative rate
    comes with an MDE of 34%. Not resolved, so not a REJECT; but not a PASS with a decode tier either: it
    is measured again, as a decode context's unresolved slowdown is. The same for the spec runs' AR pairs."""
    base_steps = _steps({1: 32, 2: 9, 3: 4, 4: 2, 6: 1})
    zs = (-1.3, -0.5, 0.0, 0.4, 0.9, 0.5)
    noisy = tuple((100.0, 100.0 * math.exp(-0.072 + 0.06 * z)) for z in zs)  # bound 0.978, MDE 7%
    hidden = tuple((100.0, 100.0 * math.exp(-0.4 + 0.45 * z)) for z in zs * 2)  # 0.67x, bound 0.833, MDE 35%

    def spec(ar, rate) -> SpecResult:
        return SpecResult("qwen2.5-coder-0.5b", "ngram-3", 7, len(rate), len(rate), None, 1.54, 1.54, ar, rate,
                          context=512, base_tau_steps=base_steps, head_tau_steps=base_steps)  # fmt: skip

    for ar, rate in ((pairs(1.0, n=12), hidden), (noisy, pairs(1.0, n=6))):
        v = decide(meas(tp(512, 1.05), accuracy=(GOOD_ACC,), spec=(spec(ar, rate),)), rules)
        assert v.status is Status.INCONCLUSIVE and v.tier is None, v.reasons
        assert any("too imprecise to call a regression" in r for r in v.reasons), v.reasons
    assert spec_unresolved([spec(pairs(1.0, n=12), pairs(1.0, n=12))], rules) == []


def test_two_ar_pairs_decide_no_slowdown_they_are_measured_again(rules):
    """The spec AR gate reads degrees of freedom as every regression call does: two pairs (one degree of
    freedom) call nothing, even at 0.5x; the slowdown is left to be measured again."""
    s = SpecResult("qwen2.5-coder-0.5b", "ngram-3", 7, 3, 3, None, 1.54, 1.54, pairs(0.5, n=2), pairs(1.0, n=6),
                   context=512)  # fmt: skip
    ar = next(g for g in spec_gates([s], rules) if g.name == "spec AR speed")
    assert ar.passed and ar.value < 0.98
    assert [e.metric for e in spec_unresolved([s], rules)] == ["spec_ar_tps"]
