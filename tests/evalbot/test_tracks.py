"""Scored tracks (rules/tracks.yaml): the rules, a score and a label per model, guards across models, the
speculative track, and the rules' errors at file:line."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from evalbot.cli import main as cli_main
from evalbot.model import (
    AccuracyResult,
    Measurements,
    Provenance,
    SpecResult,
    Status,
    ThroughputPairs,
)
from evalbot.rules import LabelFamily, RulesError, default_rules_dir, load_rules
from evalbot.verdict.decide import decide

SMALL, LARGE = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"


@pytest.fixture(scope="module")
def rules():
    return load_rules(default_rules_dir())


def add_draft_track(rules_dir: Path, model: str) -> None:
    """A spec track that drafts with models.yaml's draft model, scoring `model` on cpu-both at 512."""
    path = rules_dir / "tracks.yaml"
    suffix = model.rsplit("-", 1)[-1]
    path.write_text(path.read_text() + (
        "\nspec-draft:\n  metric: spec\n  drafter: draft\n  models:\n"
        f"    cpu-both:\n      {model}: {{scored: [512], label: perf-spec-{suffix}}}\n"))  # fmt: skip


def pairs(ratio: float, n: int = 12, noise: float = 0.004, seed: int = 0) -> tuple[tuple[float, float], ...]:
    rng = random.Random(seed)
    return tuple((100 * (1 + rng.gauss(0, noise)), 100 * ratio * (1 + rng.gauss(0, noise))) for _ in range(n))


def tp(model: str, ctx: int, ratio: float) -> ThroughputPairs:
    return ThroughputPairs(model, ctx, "decode_tps", pairs(ratio, seed=ctx + len(model)))


def meas(profile: str, *tps: ThroughputPairs, spec: tuple[SpecResult, ...] = ()) -> Measurements:
    prov = Provenance("repo", "a" * 40, "b" * 40, "a" * 40, "0" * 64, profile)
    acc = tuple(AccuracyResult(m, 128, 0.99, 0.001, 1.0) for m in dict.fromkeys(t.model for t in tps))
    return Measurements(prov, throughput=tps, accuracy=acc, spec=spec)


def both(small: float, large: float) -> Measurements:
    return meas("cpu-both", *(tp(m, c, r) for m, r in ((SMALL, small), (LARGE, large)) for c in (128, 512)))


# ---------------------------------------------------------------- a score and a label per model


def test_the_shipped_two_model_profile_gives_a_label_per_model(rules):
    v = decide(both(1.05, 1.08), rules)
    assert v.status is Status.PASS and v.tier == "M"  # the overall: the best of the decode track
    by_model = {s.model: s for s in v.scores}
    assert (by_model[SMALL].tier, by_model[LARGE].tier) == ("S", "M")
    assert {"perf-0.5b:S", "perf-1.5b:M", "perf:M", "verified"} == set(v.labels_add)
    assert set(v.labels_add) <= rules.owned(LabelFamily.VERDICT)  # the next verdict takes them off
    assert LARGE in v.reasons[0]  # which model earned the overall tier


def test_a_model_that_gained_nothing_is_labelled_none(rules):
    v = decide(both(1.05, 1.0), rules)
    assert v.status is Status.PASS and {"perf-0.5b:S", "perf-1.5b:none"} <= set(v.labels_add)


def test_a_pr_that_speeds_up_one_model_and_slows_the_other_by_5_percent_is_rejected_by_the_guard(rules):
    v = decide(both(1.10, 0.95), rules)
    assert v.status is Status.REJECT and "regression" in v.labels_add
    assert not any(label.startswith(("perf-0.5b", "perf-1.5b", "perf:")) for label in v.labels_add)
    failed = [g for g in v.gates if not g.passed]
    assert failed and {g.model for g in failed} == {LARGE}


def with_large_as_guard(rules_dir: Path):
    """The shipped rules with the 1.5B a guard on cpu-both: measured and guarded, never scored."""
    path = rules_dir / "tracks.yaml"
    scored = "      qwen2.5-coder-1.5b: {scored: [128, 512], label: perf-1.5b}"
    path.write_text(path.read_text().replace(scored, "      qwen2.5-coder-1.5b: guard"))
    return load_rules(rules_dir)


def test_a_guard_model_is_measured_and_guarded_but_never_scored(rules_dir: Path):
    rules = with_large_as_guard(rules_dir)
    fast_guard = decide(both(1.0, 1.5), rules)  # the guard's 50% buys nothing
    assert fast_guard.status is Status.PASS and fast_guard.tier is None
    assert [s.model for s in fast_guard.scores] == [SMALL]
    assert decide(both(1.1, 0.9), rules).status is Status.REJECT  # and its regression still rejects


def test_a_guard_too_noisy_to_show_it_did_not_regress_leaves_the_verdict_open(rules_dir: Path):
    """A PR that slows the guarded model and adds noise to it, so that its interval straddles the bar, gets no
    PASS on the other model's gain: INCONCLUSIVE, measured again."""
    rules = with_large_as_guard(rules_dir)
    noisy = tuple(
        ThroughputPairs(LARGE, c, "decode_tps", pairs(0.97, noise=0.05, seed=c)) for c in (128, 512)
    )
    v = decide(meas("cpu-both", tp(SMALL, 128, 1.10), tp(SMALL, 512, 1.10), *noisy), rules)
    assert v.status is Status.INCONCLUSIVE, v.reasons
    quiet = meas(
        "cpu-both", tp(SMALL, 128, 1.10), tp(SMALL, 512, 1.10), tp(LARGE, 128, 1.0), tp(LARGE, 512, 1.0)
    )
    assert decide(quiet, rules).status is Status.PASS  # a guard shown not to regress lets the gain stand


def test_a_profile_no_track_names_scores_as_before(rules):
    v = decide(meas("cpu", tp(SMALL, 128, 1.0), tp(SMALL, 512, 1.05)), rules)
    assert v.status is Status.PASS and v.tier == "S" and set(v.labels_add) == {"verified", "perf:S"}
    assert [(s.track, s.model, s.label) for s in v.scores] == [("decode", SMALL, None), ("spec", SMALL, None)]
    assert v.scores[1].estimate is None  # no spec runs measured: no label either way


# ---------------------------------------------------------------- the speculative track


def spec(ar: float, sp: float, *, lossless: int | None = None, tau: tuple[float, float] = (2.0, 2.0), runs: int = 6,
         ctx: int = 512) -> SpecResult:  # fmt: skip
    lossless = runs if lossless is None else lossless
    base_steps, head_steps = (int(tau[0]),) * 40, (int(tau[1]),) * 40
    return SpecResult(SMALL, "ngram-3", 7, runs, lossless, None if lossless == runs else 3, tau[0], tau[1],
                      ar_pairs=pairs(ar, runs, seed=1), spec_pairs=pairs(sp, runs, seed=2), context=ctx,
                      base_tau_runs=(tau[0],) * runs, head_tau_runs=(tau[1],) * runs,
                      base_tau_steps=base_steps, head_tau_steps=head_steps)  # fmt: skip


def cpu_spec(*results: SpecResult, decode: float = 1.0) -> Measurements:
    return meas("cpu", tp(SMALL, 128, decode), tp(SMALL, 512, decode), spec=results)


def test_a_better_drafter_earns_a_speculative_tier_and_no_decode_tier(rules):
    v = decide(cpu_spec(spec(1.0, 1.25, tau=(2.0, 3.0))), rules)
    assert v.status is Status.PASS and v.tier is None  # the spec track counts apart (overall: false)
    [s] = [s for s in v.scores if s.track == "spec"]
    assert s.tier == "XL" and "perf-spec:XL" in v.labels_add and "perf-spec:none" not in v.labels_add
    assert not any(label.startswith("perf:") for label in v.labels_add)
    # the headline's "no tier" is the overall one; the tier the spec track earned apart is said beside it
    assert v.reasons[0].startswith("no tier") and "counted apart: XL in the spec track" in v.reasons[0]


def test_raising_tau_by_breaking_losslessness_is_rejected(rules):
    v = decide(cpu_spec(spec(1.0, 1.6, lossless=5, tau=(2.0, 4.0))), rules)  # one run of six not lossless
    assert v.status is Status.REJECT and "spec-fail" in v.labels_add
    assert not any(label.startswith("perf-spec") for label in v.labels_add)


def test_a_speculative_gain_bought_with_an_ar_regression_is_rejected(rules):
    v = decide(cpu_spec(spec(0.9, 1.3, tau=(2.0, 3.0))), rules)
    assert v.status is Status.REJECT and any(g.name == "spec AR speed" and not g.passed for g in v.gates)


def test_a_speculative_interval_too_wide_for_its_tier_holds_it_back_to_the_tier_it_resolves(rules):
    noisy = replace(spec(1.0, 1.0), spec_pairs=((100, 140), (100, 160), (100, 150)), runs=3)
    v = decide(cpu_spec(noisy), rules)
    [s] = [s for s in v.scores if s.track == "spec"]
    assert (
        s.estimate is not None and s.estimate.tier == "XL" and s.estimate.mde > 0.18
    )  # earned, not resolved
    # 1.4x-1.6x over three runs: the lower bound is an MDE past XS's floor, not XL's (`tracks.resolves`)
    assert s.tier == "XS" and "XL held back to XS" in s.note and "perf-spec:XS" in v.labels_add


# The spec runs of `bash bench/cpu_spec_track.sh OUT demo/cpu-blind-drafts.patch` (2026-12-07, the real 0.5B,
# 2-core EPYC; docs/results/cpu_spec_track_epyc_2026-12-07e/): main's drafter proposes the last token k times,
# the PR's looks its drafts up. Main's rate is steady; the PR's runs from 1.3x to 6.5x main's, prompt by prompt.
BLIND_SPEC = (
    (3.810, 8.186), (3.773, 10.724), (3.766, 5.311), (3.677, 4.932), (3.698, 5.179), (3.571, 5.664),
    (3.499, 12.004), (3.950, 25.478), (3.947, 8.527), (3.709, 6.751), (3.887, 5.819), (3.778, 12.150),
    (3.642, 6.134), (3.627, 6.480), (3.678, 8.315), (3.802, 10.446),
)  # fmt: skip
BLIND_BLOCKS = (1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 4, 4, 4, 4, 5, 5)


def test_a_gain_far_past_its_noise_earns_its_tier_though_the_interval_is_wide(rules):
    """The measured blind-drafts run: +114% [+71%, +168%] at an MDE of 37%. Its lower bound is an MDE past
    XL's floor (1.18 * 1.37 = 1.62 <= 1.71), so XL stands; before, an MDE above every floor held it back and
    a drafter that doubled the speculative rate earned nothing."""
    blind = replace(spec(1.0, 1.0, runs=16, tau=(1.0, 2.08)), spec_pairs=BLIND_SPEC, spec_blocks=BLIND_BLOCKS,
                    base_tau_runs=(1.0,) * 16, head_tau_runs=(2.08,) * 16)  # fmt: skip
    v = decide(cpu_spec(blind), rules)
    [s] = [s for s in v.scores if s.track == "spec"]
    assert (
        s.estimate is not None and s.estimate.mde > 0.18 and s.estimate.ci_low > 1.18 * (1 + s.estimate.mde)
    )
    assert v.status is Status.PASS and s.tier == "XL" and "perf-spec:XL" in v.labels_add
    assert v.tier is None and not any(label.startswith("perf:") for label in v.labels_add)  # no decode tier


def test_a_wide_decode_gain_stands_at_its_tier_where_its_lower_bound_is_an_mde_past_the_floor(rules):
    """The same rule on the decode track: a 2x decode gain read on a noisy box (MDE over XL's 18%) is a PASS
    XL where its lower bound clears 1.18 by an MDE, not an INCONCLUSIVE measured again."""
    noisy = tuple(
        ThroughputPairs(SMALL, c, "decode_tps", pairs(2.0, n=12, noise=0.2, seed=c)) for c in (128, 512)
    )
    v = decide(meas("cpu", *noisy), rules)
    best = max((e for e in v.estimates if e.scored), key=lambda e: e.ci_low)
    assert best.mde > 0.18 and best.ci_low >= 1.18 * (1 + best.mde)
    assert v.status is Status.PASS and v.tier == "XL"


@pytest.mark.parametrize("true_gain", [0.0, 0.17])
def test_a_tier_is_resolved_past_its_floor_as_rarely_as_the_interval_allows(true_gain: float):
    """Equal code, and a true gain just under XL's floor (+17%), with the blind-drafts run's prompt spread
    (30% sd of the log-ratio, 16 runs in 5 blocks, a block offset of 3%): the first tier above the true gain
    is resolved (`tracks.resolves`, either arm) in at most 1% of 4,000 draws."""
    from evalbot import stats
    from evalbot.verdict.tracks import resolves

    rng = random.Random(5)
    floor = 0.02 if true_gain == 0.0 else 0.18
    hits = 0
    for _ in range(4000):
        pairs_, blocks = [], []
        for b, m in enumerate((3, 4, 3, 4, 2)):
            off = rng.gauss(0, 0.03)
            for _ in range(m):
                pairs_.append((10.0, 10.0 * (1 + true_gain) * 2.718281828 ** (off + rng.gauss(0, 0.30))))
                blocks.append(b)
        e = stats.estimate_clustered(pairs_, blocks)
        hits += e.ci_low >= 1 + floor and resolves(e, floor)
    assert hits / 4000 <= 0.01, hits / 4000


def test_a_spec_track_counted_overall_can_give_the_overall_tier(rules_dir: Path):
    text = (rules_dir / "tracks.yaml").read_text()
    (rules_dir / "tracks.yaml").write_text(text.replace("  overall: false", "  overall: true"))
    v = decide(cpu_spec(spec(1.0, 1.25, tau=(2.0, 3.0))), load_rules(rules_dir))
    assert v.status is Status.PASS and v.tier == "XL" and "perf:XL" in v.labels_add
    assert "speculative" in v.reasons[0] or "spec track" in v.reasons[0]


def with_spec_tiers(rules_dir: Path, tiers: str = "{XS: 0.10, S: 0.15, M: 0.25, L: 0.40, XL: 0.60}") -> Path:
    text = (rules_dir / "tracks.yaml").read_text()
    (rules_dir / "tracks.yaml").write_text(text.replace("  runs: 16\n", f"  runs: 16\n  tiers: {tiers}\n"))
    return rules_dir


def test_a_track_with_its_own_tiers_earns_and_resolves_against_them(rules_dir: Path, rules):
    own = load_rules(with_spec_tiers(rules_dir))
    assert [t.tiers for t in own.tracks if t.name == "spec"] == [
        (("XS", 0.10), ("S", 0.15), ("M", 0.25), ("L", 0.40), ("XL", 0.60))
    ]
    gained = cpu_spec(spec(1.0, 1.25, tau=(2.0, 3.0)))  # +25%, resolved to well under 1%
    [shipped] = [s for s in decide(gained, rules).scores if s.track == "spec"]
    v = decide(gained, own)
    [mine] = [s for s in v.scores if s.track == "spec"]
    assert shipped.tier == "XL" and mine.tier == "S"  # +25% is XL on decode's floors, S on the track's
    assert "perf-spec:S" in v.labels_add and "perf-spec:XL" not in v.labels_add
    # the decode track keeps tiers.yaml's floors
    assert [t.tiers for t in own.tracks if t.name == "decode"] == [()]
    shown = CliRunner().invoke(cli_main, ["rules", "check", str(rules_dir)])
    assert shown.exit_code == 0 and "perf-spec:<tier>, drafts by ngram" in shown.output
    assert "its tiers XS >= 10.0%, S >= 15.0%, M >= 25.0%, L >= 40.0%, XL >= 60.0%" in shown.output


def test_a_track_floor_the_interval_does_not_resolve_holds_its_tier_back(rules_dir: Path):
    own = load_rules(with_spec_tiers(rules_dir, "{XS: 0.03, S: 0.05, M: 0.25, L: 0.40, XL: 0.60}"))
    wide = replace(spec(1.0, 1.0), spec_pairs=((100, 120), (100, 132), (100, 112), (100, 126)), runs=4)
    [s] = [s for s in decide(cpu_spec(wide), own).scores if s.track == "spec"]
    assert s.estimate is not None and s.estimate.ci_low - 1 > 0.05 and s.estimate.mde > 0.05
    assert s.tier is None and "S held back" in s.note


# ---------------------------------------------------------------- bad rules at file:line


def broken(rules_dir: Path, old: str, new: str) -> tuple[RulesError, int]:
    path = rules_dir / "tracks.yaml"
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))
    with pytest.raises(RulesError) as info:
        load_rules(rules_dir)
    return info.value, text[: text.index(old)].count("\n") + 1


@pytest.mark.parametrize(
    ("old", "new", "field", "words"),
    [
        ("  metric: spec\n", "  metric: tokens\n", "tracks.spec.metric", "expected a track metric"),
        ("      qwen2.5-coder-1.5b: {scored: [128, 512], label: perf-1.5b}",
         "      qwen2.5-coder-7b: {scored: [128, 512], label: perf-7b}", "tracks.decode.models.cpu-both.qwen2.5-coder-7b",
         "expected a model of models.yaml's 'cpu-both' profile"),
        ("    cpu:\n      qwen2.5-coder-0.5b: {scored: [512], label: perf-spec}",
         "    cpu:\n      qwen2.5-coder-1.5b: guard", "tracks.spec.models.cpu.qwen2.5-coder-1.5b",
         "expected a model of models.yaml's 'cpu' profile"),
        ("    cpu-both:\n", "    cpu-triple:\n", "tracks.decode.models.cpu-triple", "expected a profile of profiles.yaml"),
        ("label: perf-1.5b}", "label: perf-0.5b}", "tracks.decode.models.cpu-both.qwen2.5-coder-1.5b.label",
         "already tracks.decode.models.cpu-both.qwen2.5-coder-0.5b.label"),
        ("label: perf-spec}", "label: perf}", "tracks.spec.models.cpu.qwen2.5-coder-0.5b.label",
         "'perf:XS' is already labels.tiers.XS"),
        ("{scored: [128, 512], label: perf-0.5b}", "{scored: [128, 2048], label: perf-0.5b}",
         "tracks.decode.models.cpu-both.qwen2.5-coder-0.5b.scored[1]", "expected a context of profile 'cpu-both'"),
        ("  metric: decode\n", "  metric: decode\n  drafter: draft\n", "tracks.decode.drafter", "only a 'spec' track drafts"),
        ("  metric: decode\n", "  metric: decode\n  overall: false\n", "tracks.decode.overall", "a decode track always counts"),
        ("  metric: decode\n", "  metric: decode\n  runs: 8\n", "tracks.decode.runs", "only a 'spec' track has runs"),
        ("  runs: 16\n", "  runs: 16\n  tiers: {XS: 0.1, S: 0.2, M: 0.3, L: 0.4}\n", "tracks.spec.tiers.XL",
         "missing; this mapping needs: XS, S, M, L, XL"),
        ("  runs: 16\n", "  runs: 16\n  tiers: {XS: 0.1, S: 0.2, M: 0.15, L: 0.4, XL: 0.6}\n", "tracks.spec.tiers.M",
         "expected a bound above S's 0.2"),
        ("  runs: 16\n", "  runs: 16\n  tiers: {XS: 0, S: 0.2, M: 0.3, L: 0.4, XL: 0.6}\n", "tracks.spec.tiers.XS",
         "expected a number"),
        ("label: perf-0.5b}", "label: perf-0.5b-qwen2.5-coder-instruct-q4-k-m-labels}",
         "tracks.decode.models.cpu-both.qwen2.5-coder-0.5b.label", "longer than GitHub's 50 characters"),
    ],
)  # fmt: skip
def test_a_bad_track_is_refused_at_its_file_and_line(rules_dir: Path, old, new, field, words):
    err, line = broken(rules_dir, old, new)
    assert Path(err.file).name == "tracks.yaml" and err.field == field and words in err.message, str(err)
    assert err.line is not None and line <= err.line <= line + 2, (err.line, line)


def test_drafting_with_a_model_needs_the_engine_to_say_how_it_takes_one(rules_dir: Path):
    engine = rules_dir / "engine.yaml"
    engine.write_text(engine.read_text().replace('  draft: ["--draft", "{draft}"]\n', ""))
    add_draft_track(rules_dir, LARGE)
    with pytest.raises(
        RulesError, match=r"tracks.spec-draft.drafter: drafter 'draft' needs engine.yaml's serve.draft"
    ):
        load_rules(rules_dir)


def test_without_tracks_yaml_every_model_is_scored_as_profiles_yaml_says(rules_dir: Path):
    (rules_dir / "tracks.yaml").unlink()
    rules = load_rules(rules_dir)
    assert rules.tracks == () and [t.name for t in rules.scoring] == ["decode"]
    assert rules.track_labels() == frozenset()
    v = decide(both(1.05, 1.08), rules)
    assert v.status is Status.PASS and set(v.labels_add) == {"verified", "perf:M"}


# ---------------------------------------------------------------- where spec runs, and with which drafter


def _ctx(rules, profile: str, *, spec: bool = True, drafter: str = "ngram"):
    from types import SimpleNamespace

    from evalbot.model import RunOptions

    return SimpleNamespace(ws=SimpleNamespace(rules=rules), req=SimpleNamespace(
        profile=rules.profile(profile), options=RunOptions(spec=spec, spec_drafter=drafter)))  # fmt: skip


def test_a_spec_track_with_a_draft_model_drafts_for_the_target_on_its_own_profile(rules_dir: Path):
    from evalbot.evaluate.speculative import drafter_for, drafts, spec_here

    path = rules_dir / "tracks.yaml"
    path.write_text(path.read_text() + (
        "\nspec-draft:\n  metric: spec\n  drafter: draft\n  overall: false\n  models:\n"
        "    cpu-both:\n      qwen2.5-coder-1.5b: {scored: [512], label: perf-spec-1.5b}\n"))  # fmt: skip
    rules = load_rules(rules_dir)
    both = _ctx(rules, "cpu-both")
    assert spec_here(both) and drafts(
        both
    )  # a spec track scores cpu-both, though the spec pair's profile is cpu
    assert drafter_for(both, "cpu-both", LARGE) == "draft" and drafter_for(both, "cpu-both", SMALL) == "ngram"
    assert rules.spec_contexts(rules.profile("cpu-both"), LARGE) == (512,)
    assert rules.engine.draft_model_args("/m/draft.gguf") == ["--draft", "/m/draft.gguf"]
    assert not drafts(_ctx(rules, "cpu-both", spec=False))  # --no-spec: nothing drafts, nothing is fetched
    assert not drafts(_ctx(rules, "cpu"))  # the cpu profile's spec track drafts by n-grams


def test_a_draft_model_drafts_only_for_the_spec_pairs_target(rules_dir: Path):
    add_draft_track(rules_dir, SMALL)
    with pytest.raises(
        RulesError, match=r"drafts for models\.yaml's spec target 'qwen2\.5-coder-1\.5b' only"
    ):
        load_rules(rules_dir)
