"""evalbot.rounds: merge-first ranking, ties, re-evaluation after main moves, marginal credit, auto-merge."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evalbot.model import ContextEstimate, Status, Verdict
from evalbot.rounds import (
    HELD,
    MERGE_FIRST,
    NEEDS_REBASE,
    OUT,
    RE_EVALUATE,
    Contender,
    may_automerge,
    rank_round,
)
from evalbot.rules import default_rules_dir, load_rules

MAIN, OLD_MAIN = "m" * 40, "o" * 40


@pytest.fixture(scope="module")
def rules():
    return load_rules(default_rules_dir())


def est(context: int, ci_low: float, scored: bool = True, metric: str = "decode_tps") -> ContextEstimate:
    return ContextEstimate(
        model="qwen2.5-coder-0.5b",
        context=context,
        metric=metric,
        n=8,
        base_median=40.0,
        head_median=40.0 * (ci_low + 0.01),
        ratio=ci_low + 0.01,
        ci_low=ci_low,
        ci_high=ci_low + 0.02,
        mde=0.01,
        tier=None,
        regression=False,
        guarded=True,
        scored=scored,
    )


def verdict(
    status: Status = Status.PASS, low: float = 1.05, tier: str | None = "S", rules_hash: str = ""
) -> Verdict:
    """A verdict scored at ctx 512 with CI lower bound `low` there (and a weaker ctx 128)."""
    estimates = (est(128, low - 0.01), est(512, low))
    return Verdict(
        status=status,
        tier=tier if status == Status.PASS else None,
        scored_context=512 if status == Status.PASS and tier else None,
        gates=(),
        reasons=(),
        labels_add=(),
        estimates=estimates,
        rules_hash=rules_hash,
    )


def contender(pr: int, low: float = 1.05, base: str = MAIN, status: Status = Status.PASS) -> Contender:
    return Contender(pr, f"{pr:040x}", base, verdict(status, low))


# ---------------------------------------------------------------- lower-bound gain


class TestLowerBoundGain:
    def test_at_the_scored_context(self):
        v = replace(verdict(low=1.03), estimates=(est(128, 1.08), est(512, 1.03)))
        assert v.lower_bound_gain == pytest.approx(0.03)  # the verdict's scored context, not the best

    def test_without_a_scored_context_the_best_scored_decode_bound(self):
        v = Verdict(
            Status.PASS,
            None,
            None,
            (),
            (),
            (),
            estimates=(
                est(128, 1.01),
                est(512, 1.015),
                est(512, 1.3, metric="prefill_tps"),
                est(4096, 1.2, scored=False),
            ),
        )
        assert v.lower_bound_gain == pytest.approx(0.015)

    def test_nothing_scored(self):
        assert Verdict(Status.PASS, None, None, (), (), ()).lower_bound_gain is None


# ---------------------------------------------------------------- ranking


class TestRankRound:
    def test_largest_lower_bound_merges_first_the_rest_rebase(self, rules):
        r = rank_round([contender(10, 1.03), contender(11, 1.07), contender(12, 1.05)], MAIN, rules)
        assert (r.merge_first, r.order) == (11, (11, 12, 10))
        first = r.decision(11)
        assert (first.role, first.labels_add) == (MERGE_FIRST, ("merge-first",))
        assert first.lower_bound_gain == pytest.approx(0.07) and first.comment is None
        second = r.decision(12)
        assert (second.role, second.labels_add) == (NEEDS_REBASE, ("needs-rebase",))
        assert second.reason == "place 2 (+5.0%); #11 merges first (+7.0%)"
        assert "#11 has the largest lower-bound gain in this round (+7.0%" in second.comment
        assert "rebase on main" in second.comment
        assert [d.pr for d in r.decisions] == [10, 11, 12]

    def test_ties_go_to_the_earlier_pr_whatever_the_input_order(self, rules):
        crowd = [contender(30, 1.04), contender(7, 1.04), contender(19, 1.04), contender(5, 1.02)]
        for perm in itertools.permutations(crowd):
            r = rank_round(perm, MAIN, rules)
            assert (r.merge_first, r.order) == (7, (7, 19, 30, 5))

    @given(
        st.lists(
            st.tuples(st.integers(1, 60), st.sampled_from([1.0, 1.02, 1.04, 1.1])), unique_by=lambda t: t[0]
        ),
        st.randoms(),
    )
    def test_ranking_is_by_gain_then_number_and_input_order_free(self, rules, entries, rnd):
        cs = [contender(pr, low) for pr, low in entries]
        shuffled = cs[:]
        rnd.shuffle(shuffled)
        a, b = rank_round(cs, MAIN, rules), rank_round(shuffled, MAIN, rules)
        assert a == b
        assert list(a.order) == [pr for pr, _ in sorted(entries, key=lambda t: (-t[1], t[0]))]
        assert sum(d.role == MERGE_FIRST for d in a.decisions) == (1 if entries else 0)

    def test_only_passes_with_a_gain_contend(self, rules):
        nothing = Contender(4, "4" * 40, MAIN, Verdict(Status.PASS, None, None, (), (), ()))
        r = rank_round(
            [
                contender(1, 1.03),
                contender(2, 1.2, status=Status.REJECT),
                contender(3, 1.2, status=Status.INFRA_ERROR),
                nothing,
            ],
            MAIN,
            rules,
        )
        assert (r.merge_first, r.order) == (1, (1,))
        assert [(d.pr, d.role) for d in r.decisions] == [(1, MERGE_FIRST), (2, OUT), (3, OUT), (4, OUT)]
        assert r.decision(2).reason == "not a contender: the verdict is REJECT"
        assert r.decision(4).reason == "not a contender: no scored decode estimate"
        assert r.decision(2).labels_add == ()

    def test_measured_against_an_old_main_must_be_re_evaluated(self, rules):
        r = rank_round([contender(1, 1.03), contender(2, 1.2, base=OLD_MAIN)], MAIN, rules)
        assert r.merge_first == 1  # a bigger gain against an old main does not win
        d = r.decision(2)
        assert (d.role, d.labels_add) == (RE_EVALUATE, ("re-evaluate",))
        assert d.reason == f"measured against {OLD_MAIN[:12]}, main is now {MAIN[:12]}"
        assert "credits only its gain" in d.comment

    def test_held_prs_step_aside(self, rules):
        r = rank_round([contender(1, 1.03), contender(2, 1.2)], MAIN, rules, held={2})
        assert (r.merge_first, r.decision(2).role, r.decision(2).labels_add) == (1, HELD, ())

    def test_empty_round_and_duplicates(self, rules):
        r = rank_round([], MAIN, rules)
        assert (r.merge_first, r.order, r.decisions) == (None, (), ())
        with pytest.raises(ValueError, match="PR 3 appears twice"):
            rank_round([contender(3), contender(3, 1.1)], MAIN, rules)
        with pytest.raises(KeyError):
            r.decision(3)


# ---------------------------------------------------------------- auto-merge


@pytest.fixture(scope="module")
def enabled(rules):
    return replace(rules, automerge=replace(rules.automerge, enabled=True, min_tier="S"))


HEAD = "h" * 40
HASH = load_rules(default_rules_dir()).rules_hash  # replace() in the fixture keeps the loaded hash


class TestMayAutomerge:
    def ok_args(self, rules):
        return dict(
            verdict=verdict(low=1.05, tier="M", rules_hash=rules.rules_hash),
            labels=("verified", "perf:M", "area:kernels", "merge-first"),
            rules=rules,
            env_flag=True,
            measured_sha=HEAD,
            current_head_sha=HEAD,
        )

    def test_all_conditions_met(self, enabled):
        ok, reason = may_automerge(**self.ok_args(enabled))
        assert ok and reason == f"PASS at tier M, head {HEAD[:12]} as measured, no blocking label"

    @pytest.mark.parametrize(
        "change, reason",
        [
            ({"env_flag": False}, "the operator has not enabled auto-merge (EVALBOT_AUTOMERGE=1)"),
            ({"current_head_sha": "p" * 40}, f"the head moved to {'p' * 12} after {HEAD[:12]} was measured"),
            ({"verdict": verdict(Status.REJECT)}, "the verdict is REJECT, not PASS"),
            (
                {"verdict": verdict(tier="M", rules_hash="0" * 64)},
                "the verdict was not made under the rules in force: it must be measured again",
            ),
            (
                {"verdict": verdict(tier="M")},
                "the verdict was not made under the rules in force: it must be measured again",
            ),
            ({"held": True}, "a maintainer put the PR on hold"),
            (
                {"labels": ("verified", "perf:M", "copycat-warn", "re-evaluate")},
                "blocking label(s): copycat-warn, re-evaluate",
            ),
            ({"labels": ("perf:M",)}, "missing required label(s): verified"),
            ({"verdict": verdict(tier="XS", rules_hash=HASH)}, "tier XS is below the auto-merge minimum S"),
            ({"verdict": verdict(tier=None, rules_hash=HASH)}, "no tier; auto-merge needs at least S"),
        ],
        ids=[
            "no-env",
            "head-moved",
            "reject",
            "rules-changed",
            "rules-unknown",
            "held",
            "blocking",
            "required",
            "low-tier",
            "no-tier",
        ],
    )
    def test_each_condition_blocks(self, enabled, change, reason):
        args = {**self.ok_args(enabled), **change}
        assert may_automerge(**args) == (False, reason)

    def test_disabled_in_rules_wins_over_everything(self, rules):
        assert rules.automerge.enabled is False  # the shipped default
        assert may_automerge(**self.ok_args(rules)) == (
            False,
            "auto-merge is disabled in rules/automerge.yaml",
        )

    def test_min_tier_is_inclusive(self, enabled):
        args = {**self.ok_args(enabled), "verdict": verdict(tier="S", rules_hash=HASH)}
        assert may_automerge(**args)[0] is True


class TestMergeBlocker:
    """What the poller reads again just before a merge: only what was measured merges, where it was."""

    def fresh(self, **kw):
        from tests.evalbot.test_policy import make_pr

        return make_pr(7, **{"head_sha": HEAD, "labels": ("verified", "perf:M", "merge-first"), **kw})

    def check(self, rules, fresh, main_now=MAIN):
        from evalbot.rounds import merge_blocker

        return merge_blocker(verdict(low=1.05, tier="M", rules_hash=rules.rules_hash), HEAD, MAIN, fresh, main_now,
                             rules, main_branch="main", automerge_env=True, held=False)  # fmt: skip

    def test_all_holds(self, enabled):
        assert self.check(enabled, self.fresh()) is None

    def test_a_moved_main_or_head_is_measured_again(self, enabled):
        moved_main = self.check(enabled, self.fresh(), main_now=OLD_MAIN)
        moved_head = self.check(enabled, self.fresh(head_sha="p" * 40))
        assert moved_main.why.startswith("main moved") and moved_main.measure_again
        assert moved_head.why.startswith("the head moved") and moved_head.measure_again

    def test_a_retargeted_pr_never_merges_and_is_not_queued(self, enabled):
        b = self.check(enabled, self.fresh(base_ref="release"), main_now=OLD_MAIN)
        assert b.why == "it now targets 'release', not 'main'" and not b.measure_again

    def test_the_automerge_rules_and_a_test_change_block(self, rules, enabled):
        from evalbot.model import FileChange

        assert self.check(rules, self.fresh()).why == "auto-merge is disabled in rules/automerge.yaml"
        tests_changed = self.fresh(files=(FileChange("tests/test_speed.py", "modified", 1, 1),))
        assert "maintainer" in self.check(enabled, tests_changed).why


# ---------------------------------------------------------------- rounds per track (tracks.yaml)


def with_spec(v: Verdict, spec_low: float | None, tier: str | None) -> Verdict:
    """v with a speculative-track score whose 95% CI starts at spec_low (None: no spec measured)."""
    from evalbot.model import TrackScore

    decode = TrackScore("decode", "decode", "qwen2.5-coder-0.5b", v.tier, None, v.estimates[-1])
    spec = TrackScore("spec", "spec", "qwen2.5-coder-0.5b", tier, f"perf-spec:{tier or 'none'}",
                      None if spec_low is None else replace(est(512, spec_low), metric="spec_tps"), overall=False)  # fmt: skip
    return replace(v, scores=(decode, spec))


def test_each_track_has_its_own_merge_first_and_a_pr_that_leads_two_gets_both(rules):
    fast = Contender(1, "h1", MAIN, with_spec(verdict(low=1.08, tier="M"), 1.00, None))
    drafter = Contender(2, "h2", MAIN, with_spec(verdict(low=1.01, tier=None), 1.30, "XL"))
    slow = Contender(3, "h3", MAIN, with_spec(verdict(low=1.03, tier="XS"), 1.10, "M"))
    r = rank_round([fast, drafter, slow], MAIN, rules)
    assert dict(r.winners) == {"decode": 1, "spec": 2}
    assert r.order[:2] == (1, 2) and r.merge_first == 1
    assert r.decision(1).role == MERGE_FIRST and r.decision(2).role == MERGE_FIRST
    assert r.decision(3).role == NEEDS_REBASE
    assert "spec track" in r.decision(2).reason and "decode track" in r.decision(1).reason
    both = Contender(4, "h4", MAIN, with_spec(verdict(low=1.12, tier="L"), 1.40, "XL"))
    r = rank_round([fast, drafter, both], MAIN, rules)
    assert r.tracks_won(4) == ("decode", "spec") and r.order[0] == 4
    assert "decode track and the spec track" in r.decision(4).reason


def test_a_speculative_score_without_a_tier_leads_no_track(rules):
    a = Contender(1, "h1", MAIN, with_spec(verdict(low=1.08, tier="M"), 1.15, None))  # held back: no tier
    b = Contender(2, "h2", MAIN, with_spec(verdict(low=1.03, tier="XS"), None, None))
    r = rank_round([a, b], MAIN, rules)
    assert dict(r.winners) == {"decode": 1} and r.decision(2).role == NEEDS_REBASE


def test_a_track_kept_apart_from_the_overall_tier_never_merges_itself(rules):
    """The shipped spec track (overall: false) earns a label and leads its round, but auto-merge reads the
    overall tier only: its winner waits for a maintainer."""
    am_rules = replace(rules, automerge=replace(rules.automerge, enabled=True))
    spec_only = with_spec(verdict(low=1.01, tier=None, rules_hash=rules.rules_hash), 1.30, "XL")
    refused = may_automerge(spec_only, ["verified"], am_rules, True, "h", "h")
    assert refused == (False, "no tier; auto-merge needs at least XS")
    overall = replace(spec_only, tier="XL")  # a spec track with overall: true gives the verdict its tier
    ok, why = may_automerge(overall, ["verified"], am_rules, True, "h", "h")
    assert ok and "tier XL" in why
