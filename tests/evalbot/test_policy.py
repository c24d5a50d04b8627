"""evalbot.policy: each intake rule on realistic PRs, the PR template parser, and intake's combination."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from evalbot.model import Commit, FileChange, PullRequest, Status, Verdict
from evalbot.policy import (
    Action,
    IntakeContext,
    areas,
    blocklist,
    cap,
    claim_gap,
    drafts,
    intake,
    parse_body,
    sensitive_paths,
    stale,
    template,
)
from evalbot.policy.decision import is_maintainer, parse_time
from evalbot.rules import LabelFamily, default_rules_dir, load_rules

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
TEMPLATE = (default_rules_dir().parent / ".github" / "PULL_REQUEST_TEMPLATE.md").read_text()

GOOD_BODY = """\
## What this changes

Fuses the rotary embedding into the QKV projection so decode reads q and k once.

## Local benchmark

- [x] Tested: I ran the benchmark below on `main` and on this branch, on the same machine

| model | context | base tok/s | head tok/s | change |
|-------|---------|------------|------------|--------|
| qwen2.5-coder-0.5b | 128 | 41.2 | 43.0 | +4.4% |
| qwen2.5-coder-0.5b | 512 | 38.0 | 40.1 | +5.5% |
"""

PLACEHOLDER_BODY = """\
- [x] Tested: I ran the benchmark below on `main` and on this branch, on the same machine

| model | context | base tok/s | head tok/s | change |
|-------|---------|------------|------------|--------|
| qwen2.5-coder-0.5b | 128 | TBD | TBD | |
| qwen2.5-coder-0.5b | 512 | xx | xx.x | ? |
"""

NO_GAIN_BODY = """\
- [x] Tested: I ran the benchmark below on `main` and on this branch, on the same machine

| model | context | base tok/s | head tok/s | change |
|-------|---------|------------|------------|--------|
| qwen2.5-coder-0.5b | 128 | 41.2 | 41.0 | -0.5% |
| qwen2.5-coder-0.5b | 512 | 38.0 | 38.0 | 0% |
"""

FREE_TEXT_BODY = """\
Small cleanup of the sampling loop. Should make decode about 3% faster on my laptop.

Fixes #12.
"""


def said(d) -> str:
    """What the PR is told: a rule's (or intake's) prose rendered by its templates."""
    from evalbot.render import render_prose

    c = d.comment
    return render_prose(c if isinstance(c, tuple) else (c,) if c is not None else ())


@pytest.fixture(scope="module")
def rules():
    return load_rules(default_rules_dir())


def make_pr(number: int = 42, **kw) -> PullRequest:
    files = kw.pop("files", (FileChange("kernels/flash_decode.py", "modified", 20, 5),))
    facts = dict(
        number=number,
        author="alice",
        title="Faster decode",
        body=GOOD_BODY,
        state="open",
        draft=False,
        merged=False,
        head_sha="a" * 40,
        base_sha="b" * 40,
        base_ref="main",
        head_ref="fast-decode",
        created_at="2026-11-29T09:00:00Z",
        updated_at="2026-11-29T09:30:00Z",
        files=files,
        commits=(Commit("c" * 40, "alice", "alice", "Alice", "Alice"),),
        author_association="CONTRIBUTOR",
    )
    facts.update(kw)
    return PullRequest(**facts)


def context(**kw) -> IntakeContext:
    return IntakeContext(now=kw.pop("now", NOW), **kw)


def verdict(status: Status, tier: str | None = None) -> Verdict:
    return Verdict(status=status, tier=tier, scored_context=None, gates=(), reasons=(), labels_add=())


# ---------------------------------------------------------------- drafts


class TestDrafts:
    def test_draft_is_ignored_without_labels_or_comment(self, rules):
        d = drafts.check(make_pr(draft=True), rules)
        assert (d.action, d.evaluate, d.labels_add, d.comment) == (Action.IGNORE, False, (), None)
        assert "ready for review" in d.reason

    def test_closed_pr_is_ignored(self, rules):
        assert drafts.check(make_pr(state="closed"), rules).reason.startswith("not open (closed)")

    def test_ready_pr_passes(self, rules):
        assert drafts.check(make_pr(), rules) is None


# ---------------------------------------------------------------- blocklist


class TestBlocklist:
    def test_opener_on_the_rules_blocklist_is_flagged_and_closed(self, rules):
        r = replace(rules, policy=replace(rules.policy, blocklist=("Mallory",)))
        d = blocklist.check(make_pr(author="mallory"), r)
        assert (d.action, d.evaluate, d.close, d.labels_add) == (
            Action.CLOSE_FLAG,
            False,
            True,
            ("flagged:gaming",),
        )
        assert "mallory (opener)" in d.reason and "blocklist" in said(d)

    def test_store_blocklist_is_case_insensitive(self, rules):
        assert blocklist.check(make_pr(author="Mallory"), rules, blocked={"MALLORY"}) is not None
        assert blocklist.check(make_pr(author="alice"), rules, blocked={"mallory"}) is None

    @pytest.mark.parametrize(
        "commit, role",
        [
            (Commit("d" * 40, "mallory", "alice"), "author of dddddddddddd"),
            (Commit("d" * 40, "alice", "mallory"), "committer of dddddddddddd"),
            (Commit("d" * 40, None, "alice", author_name="mallory"), "git author name of dddddddddddd"),
            (
                Commit("d" * 40, "alice", None, committer_name=" Mallory "),
                "git committer name of dddddddddddd",
            ),
        ],
        ids=["author", "committer", "git-author-name", "git-committer-name"],
    )
    def test_any_commit_author_or_committer_counts(self, rules, commit, role):
        pr = make_pr(commits=(Commit("c" * 40, "alice", "alice"), commit))
        d = blocklist.check(pr, rules, blocked={"mallory"})
        assert d is not None and role in d.reason

    def test_git_name_is_not_matched_when_the_login_is_known(self, rules):
        # "mallory" as a display name of a linked account is someone else's free text, not an identity.
        pr = make_pr(commits=(Commit("c" * 40, "alice", "alice", author_name="mallory"),))
        assert blocklist.check(pr, rules, blocked={"mallory"}) is None

    def test_maintainers_are_not_exempt(self, rules):
        pr = make_pr(author="owner1", author_association="OWNER")
        assert is_maintainer(pr)
        assert blocklist.check(pr, rules, blocked={"owner1"}).close is True

    def test_comment_escapes_logins_and_names_each_once(self, rules):
        pr = make_pr(author="bad_actor", commits=(Commit("c" * 40, "Bad_Actor", "bad_actor"),))
        d = blocklist.check(pr, rules, blocked={"bad_actor"})
        assert "bad\\_actor is on" in said(d) and "Bad\\_Actor" not in said(d)
        assert d.reason.count("(") == 3  # opener, author, committer: every role is in the log


# ---------------------------------------------------------------- sensitive paths


class TestSensitivePaths:
    @pytest.mark.parametrize(
        "path, hit",
        [
            ("evalbot/verdict/decide.py", True),
            ("rules/tiers.yaml", True),
            (".github/workflows/ci.yml", True),
            ("engine/cli.py", True),
            ("engine/data/prompt.txt", True),
            ("evalbot", True),  # a file or link replacing the folder
            ("evalbot_extra/x.py", False),
            ("engine/cli.py.orig", False),
            ("engine/model.py", False),
            ("kernels/flash_decode.py", False),
            ("docs/rules/readme.md", False),
        ],
    )
    def test_folder_prefix_and_exact_paths(self, rules, path, hit):
        assert sensitive_paths.sensitive_hits([path], rules.policy.sensitive_paths) == (
            (path,) if hit else ()
        )

    def test_contributor_pr_is_skipped_with_the_paths_listed(self, rules):
        files = (
            FileChange("kernels/flash_decode.py", "modified", 3, 1),
            FileChange("bench/run_ab.py", "modified", 2, 2),
            FileChange("engine/cli.py", "modified", 1, 1),
        )
        d = sensitive_paths.check(make_pr(files=files), rules)
        assert (d.action, d.evaluate, d.labels_add) == (Action.SKIP, False, ("skipped:sensitive",))
        assert "- bench/run\\_ab.py\n- engine/cli.py" in said(d) and "flash" not in said(d)
        assert d.reason == "touches sensitive paths: bench/run_ab.py, engine/cli.py"

    def test_rename_out_of_a_sensitive_folder_counts(self, rules):
        moved = FileChange(
            "engine/reference_moved.py", "renamed", 0, 0, previous_path="evalbot/reference/cli.py"
        )
        assert sensitive_paths.check(make_pr(files=(moved,)), rules).reason.endswith(
            "evalbot/reference/cli.py"
        )

    @pytest.mark.parametrize("association", ["OWNER", "MEMBER", "COLLABORATOR", "owner"])
    def test_maintainers_are_exempt(self, rules, association):
        pr = make_pr(
            files=(FileChange("evalbot/rounds.py", "modified", 5, 1),), author_association=association
        )
        assert sensitive_paths.check(pr, rules) is None

    def test_contributor_association_is_not_a_maintainer(self, rules):
        pr = make_pr(
            files=(FileChange("rules/tiers.yaml", "modified", 1, 1),), author_association="CONTRIBUTOR"
        )
        assert sensitive_paths.check(pr, rules) is not None

    def test_long_lists_are_cut_and_hostile_names_escaped(self, rules):
        files = tuple(FileChange(f"evalbot/f{i}.py", "added", 1, 0) for i in range(25))
        files += (FileChange("evalbot/<img src=x>@admin.py", "added", 1, 0),)
        d = sensitive_paths.check(make_pr(files=files), rules)
        assert "evalbot/f19.py" in said(d) and "evalbot/f20.py" not in said(d)
        assert "… and 6 more" in said(d) and "<img" not in said(d)


# ---------------------------------------------------------------- cap


class TestCap:
    def prs(self, n: int, author: str = "alice") -> tuple[PullRequest, ...]:
        return tuple(
            make_pr(100 + i, author=author, created_at=f"2026-11-{10 + i:02d}T09:00:00Z") for i in range(n)
        )

    def test_oldest_n_are_evaluated_newer_skipped(self, rules):
        mine = self.prs(7)  # cap is 5
        results = [cap.check(p, rules, mine) for p in mine]
        assert [d is None for d in results] == [True] * 5 + [False] * 2
        d = results[5]
        assert (d.action, d.evaluate, d.labels_add) == (Action.SKIP, False, ("skipped:cap",))
        assert "number 6 of yours" in said(d) and "5 oldest" in said(d)

    def test_ties_go_to_the_lower_number_and_order_is_by_time_not_number(self, rules):
        same = tuple(make_pr(n, created_at="2026-11-10T09:00:00Z") for n in (9, 3, 7))
        late_low = make_pr(1, created_at="2026-11-20T09:00:00Z")
        assert [cap.queue_position(p, (*same, late_low)) for p in (*same, late_low)] == [3, 1, 2, 4]

    def test_drafts_closed_and_other_authors_take_no_slot(self, rules):
        mine = self.prs(5)
        others = self.prs(5, author="bob")
        draft = make_pr(90, created_at="2026-11-01T09:00:00Z", draft=True)
        closed = make_pr(91, created_at="2026-11-01T09:00:00Z", state="closed")
        newest = make_pr(200, author="Alice", created_at="2026-11-28T09:00:00Z")
        ctx_prs = (*mine, *others, draft, closed, newest)
        assert cap.check(newest, rules, ctx_prs) is not None  # sixth of alice's (any case)
        assert cap.check(mine[-1], rules, ctx_prs) is None

    def test_the_pr_itself_counts_even_if_missing_from_the_listing(self, rules):
        newest = make_pr(200, created_at="2026-11-28T09:00:00Z")
        assert cap.check(newest, rules, self.prs(5)) is not None

    def test_bad_timestamp_is_a_clear_error(self, rules):
        with pytest.raises(ValueError, match="PR 42 created_at: expected an ISO 8601 UTC timestamp"):
            cap.check(make_pr(created_at="yesterday"), rules, ())


# ---------------------------------------------------------------- stale and exhausted


class TestStale:
    def test_fruitless_counts_rejects_and_no_tier_passes_only(self):
        vs = [
            verdict(Status.REJECT),
            verdict(Status.PASS, None),
            verdict(Status.PASS, "S"),
            verdict(Status.INFRA_ERROR),
            verdict(Status.SKIPPED),
        ]
        assert stale.fruitless(vs) == 2

    def test_more_than_the_limit_is_exhausted(self, rules):
        two = (verdict(Status.REJECT), verdict(Status.PASS, None))
        assert stale.check(make_pr(), rules, two, NOW) is None  # exactly the limit: still evaluated
        three = (*two, verdict(Status.REJECT))
        d = stale.check(make_pr(), rules, three, NOW)
        assert (d.action, d.evaluate, d.labels_add) == (Action.SKIP, False, ("exhausted",))
        assert d.reason == "exhausted: 3 evaluations without a tier (limit 2)"

    def test_infra_errors_never_exhaust(self, rules):
        assert stale.check(make_pr(), rules, [verdict(Status.INFRA_ERROR)] * 10, NOW) is None

    def test_stale_after_the_configured_days_without_push(self, rules):
        pr = make_pr(created_at="2026-09-01T00:00:00Z")
        at_limit = (NOW - timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
        assert stale.check(pr, rules, (), NOW, last_push_at=at_limit) is None
        past = (NOW - timedelta(days=30, seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        d = stale.check(pr, rules, (), NOW, last_push_at=past)
        assert (d.labels_add, d.reason) == (("stale",), "stale: no push for 30 days (limit 30)")
        assert "Push a commit" in said(d)

    def test_creation_time_when_no_push_is_known(self, rules):
        assert stale.check(make_pr(created_at="2026-10-01T00:00:00Z"), rules, (), NOW) is not None
        assert stale.check(make_pr(created_at="2026-11-01T00:00:00Z"), rules, (), NOW) is None

    def test_threshold_comes_from_the_rules(self, rules):
        r = replace(
            rules, policy=replace(rules.policy, stale=replace(rules.policy.stale, days_without_push=3))
        )
        assert stale.check(make_pr(created_at="2026-11-26T00:00:00Z"), r, (), NOW) is not None

    def test_bad_push_time_is_a_clear_error(self, rules):
        with pytest.raises(ValueError, match="last push: expected an ISO 8601 UTC timestamp"):
            stale.check(make_pr(), rules, (), NOW, last_push_at="2026-11-30 12:00")  # no zone

    def test_parse_time_accepts_z_and_offsets(self):
        assert parse_time("2026-11-30T12:00:00Z", "t") == NOW
        assert parse_time("2026-11-30T13:00:00+01:00", "t") == NOW


# ---------------------------------------------------------------- the PR template


class TestTemplate:
    def test_ticked_box_with_a_real_table_passes_and_is_parsed(self, rules):
        facts = parse_body(GOOD_BODY)
        assert facts.tested is True and facts.table_found and facts.placeholders == ()
        assert [(r.context, r.base_tps, r.head_tps) for r in facts.rows] == [
            (128, 41.2, 43.0),
            (512, 38.0, 40.1),
        ]
        assert facts.claimed_gain == pytest.approx(40.1 / 38.0 - 1)
        assert facts.claimed_gain_at(128) == pytest.approx(43.0 / 41.2 - 1)
        assert facts.claimed_gain_at(4096) == facts.claimed_gain  # no row: the overall claim
        assert template.check(make_pr(body=GOOD_BODY), rules) is None

    def test_body_without_the_template_gets_a_clear_reason(self, rules):
        d = template.check(make_pr(body=FREE_TEXT_BODY), rules)
        assert (d.action, d.evaluate, d.labels_add) == (Action.NEEDS_BENCHMARK, False, ("needs-benchmark",))
        assert "does not follow the pull request template" in d.reason
        assert parse_body(FREE_TEXT_BODY).stated_gain == pytest.approx(0.03)  # kept for the report

    @pytest.mark.parametrize("body", [None, "", "   \n", "|||\n|-|\n", "- [x]\n", "<!-- unclosed"])
    def test_degenerate_bodies_never_crash(self, rules, body):
        d = template.check(make_pr(body=body), rules)
        assert d is not None and d.action == Action.NEEDS_BENCHMARK

    def test_placeholders_are_named(self, rules):
        facts = parse_body(PLACEHOLDER_BODY)
        assert facts.tested and facts.table_found and facts.filled_rows == ()
        d = template.check(make_pr(body=PLACEHOLDER_BODY), rules)
        assert (
            d.reason
            == "needs a local benchmark: the before/after table holds no numbers (found: TBD, xx, xx.x)"
        )

    def test_table_with_no_gain(self, rules):
        d = template.check(make_pr(body=NO_GAIN_BODY), rules)
        assert d.reason == "needs a local benchmark: your own numbers show no gain (best +0.0%)"

    def test_unticked_box_and_missing_table(self, rules):
        unticked = GOOD_BODY.replace("- [x] Tested", "- [ ] Tested")
        assert template.problem(parse_body(unticked)) == "the Tested box is not ticked"
        no_table = GOOD_BODY.split("| model")[0]
        assert template.problem(parse_body(no_table)) == "the description has no before/after table"
        no_box = GOOD_BODY.replace("- [x] Tested: I ran", "I ran")
        assert template.problem(parse_body(no_box)) == "the description has no Tested box"

    def test_the_shipped_template_unfilled_needs_a_benchmark(self, rules):
        facts = parse_body(TEMPLATE)
        assert facts.tested is False and facts.table_found and len(facts.rows) == 2
        assert facts.placeholders == ("",) * 4 and facts.claimed_gain is None

    def test_the_shipped_template_filled_in_passes(self, rules):
        filled = TEMPLATE.replace("- [ ] Tested", "- [X] Tested")
        filled = filled.replace("| 128 | | | |", "| 128 | 41.2 tok/s | **43.5** | +5.6% |")
        filled = filled.replace("| 512 | | | |", "| 512 | 1,038.0 | 1,090.2 | +5.0% |")
        facts = parse_body(filled)
        assert [r.base_tps for r in facts.rows] == [41.2, 1038.0]
        assert template.check(make_pr(body=filled), rules) is None

    def test_template_commands_match_the_rules(self, rules):
        commands = template.bench_commands(rules)
        assert commands == (
            "python -m engine bench --model qwen2.5-coder-0.5b --ctx 128 --runs 5",
            "python -m engine bench --model qwen2.5-coder-0.5b --ctx 512 --runs 5",
        )
        for command in commands:  # the template a contributor sees says the same as the bot's comment
            assert command in TEMPLATE
        d = template.check(make_pr(body=FREE_TEXT_BODY), rules)
        assert all(c in said(d) for c in commands) and "tokens per second" in said(d)

    def test_a_row_per_side_reads_as_a_column_per_side(self, rules):
        """A contest's own before/after table, one row per side and a column per context (#38): the same
        claims as the column-per-side layout, and such a PR is not labelled needs-benchmark."""
        body = """- [x] Tested: I ran the benchmark below on `main` and on this branch

| decode tok/s | ctx 128 | 4k |
|---|--:|--:|
| main (before) | 41.2 | 1,038.0 tok/s |
| this PR (after) | **43.5** | 1,090.2 |
| change | +5.6% | +5.0% |
"""
        facts = parse_body(body)
        assert [(r.context, r.base_tps, r.head_tps, r.change) for r in facts.rows] == [
            (128, 41.2, 43.5, pytest.approx(0.056)), (4096, 1038.0, 1090.2, pytest.approx(0.05))]  # fmt: skip
        assert template.check(make_pr(body=body), rules) is None

    def test_a_table_it_cannot_read_is_named_in_the_notice(self, rules):
        body = "- [x] Tested: I ran the benchmark\n\n| run | tok/s |\n|---|---|\n| 1 | 40.1 |\n| 2 | 42.0 |\n"
        d = template.check(make_pr(body=body), rules)
        assert d is not None and "its table (| run | tok/s |) is not a before/after table" in d.reason
        assert "a row per side" in d.reason
        hostile = body.replace("| run | tok/s |", "| @maintainers [x](http://evil) | tok/s |")
        text = said(template.check(make_pr(body=hostile), rules))
        # the PR's text is escaped: no mention, no link
        assert "@maintainers" not in text and "@&#8203;maintainers" in text and "](http://" not in text

    def test_change_column_only_and_other_spellings(self):
        body = """- [x] benchmarked on my box

| Model | Ctx | Speedup |
| :--- | ---: | :---: |
| qwen3-8b | 4k | **+5.1%** |
| qwen3-8b | 16K | 1.08x |
| qwen3-8b | 32768 | −2.0 % |
"""
        facts = parse_body(body)
        assert [(r.context, r.gain) for r in facts.rows] == [
            (4096, pytest.approx(0.051)),
            (16384, pytest.approx(0.08)),
            (32768, pytest.approx(-0.02)),
        ]
        assert facts.tested and facts.claimed_gain == pytest.approx(0.08)

    def test_tables_and_boxes_in_comments_and_code_fences_are_ignored(self):
        body = """<!--
- [x] Tested
| base | head |
|---|---|
| 1 | 2 |
-->
```
- [x] Tested
| base | head |
|---|---|
| 1 | 2 |
```
Claimed gain: 12% faster
"""
        facts = parse_body(body)
        assert (facts.tested, facts.table_found, facts.stated_gain) == (None, False, pytest.approx(0.12))

    def test_comment_escapes_what_the_contributor_wrote(self, rules):
        body = PLACEHOLDER_BODY.replace("TBD", "@maintainers")
        d = template.check(make_pr(body=body), rules)
        assert "@maintainers" not in said(d) and "@&#8203;maintainers" in said(d)

    def test_not_required_means_labelled_but_evaluated(self, rules):
        tp = replace(rules.policy.template, require_benchmark=False)
        r = replace(rules, policy=replace(rules.policy, template=tp))
        d = template.check(make_pr(body=FREE_TEXT_BODY), r)
        assert d.evaluate is True and d.labels_add == ("needs-benchmark",)


class TestClaimGap:
    def test_far_above_the_measurement_is_flagged(self, rules):
        g = claim_gap(0.12, 0.015, 0.031, rules)
        assert g.flagged and g.label == "claim-gap" and g.gap == pytest.approx(0.089)
        assert g.reason == (
            "claimed +12.0%, measured +3.1% (95% CI lower bound +1.5%): 8.9 points above the measurement, "
            "more than the 5.0 allowed; a maintainer should look"
        )

    def test_close_claims_and_modest_claims_are_not(self, rules):
        assert not claim_gap(0.08, 0.02, 0.031, rules).flagged  # 4.9 points: within
        assert not claim_gap(0.01, 0.02, 0.031, rules).flagged  # below the measurement
        assert claim_gap(0.04, -0.03, -0.02, rules).flagged  # claimed a gain, measured a loss

    def test_nothing_to_compare(self, rules):
        assert claim_gap(None, 0.02, 0.03, rules).reason == "no claimed gain to compare"
        g = claim_gap(0.05, None, None, rules)
        assert (g.flagged, g.gap, g.label, g.reason) == (False, None, None, "no measured gain to compare")


# ---------------------------------------------------------------- areas


class TestAreas:
    @pytest.mark.parametrize(
        "path, pattern, hit",
        [
            ("kernels/flash_decode.py", "kernels/**", True),
            ("kernels/sub/dir/x.py", "kernels/**", True),
            ("kernelsx/a.py", "kernels/**", False),
            ("engine/ops.py", "engine/*.py", True),
            ("engine/sub/ops.py", "engine/*.py", False),
            ("tests/engine/test_ops.py", "**/test_*.py", True),
            ("test_ops.py", "**/test_*.py", True),
            ("engine/ops.py", "engine/op?.py", True),
            ("engine/ops1.py", "engine/ops[0-9].py", True),
            ("engine/opsx.py", "engine/ops[!0-9].py", True),
            ("engine/ops1.py", "engine/ops[!0-9].py", False),
            ("README.md", "**", True),
            ("a.b", "a?b", True),
            ("a+b", "a.b", False),
        ],
    )
    def test_glob_semantics(self, path, pattern, hit):
        assert areas.matches(path, pattern) is hit

    def test_first_matching_area_wins(self, rules):
        assert areas.area_of("engine/ops.py", rules) == "area:kernels"  # listed before engine/**
        assert areas.area_of("engine/speculative.py", rules) == "area:spec"
        assert areas.area_of("engine/model.py", rules) == "area:engine"
        assert areas.area_of("docs/benchmarks.md", rules) == "area:other"

    def test_pr_areas_in_rules_order_with_renames(self, rules):
        files = (
            FileChange("docs/x.md", "modified", 1, 1),
            FileChange("engine/generate.py", "renamed", 0, 0, previous_path="engine/speculative.py"),
        )
        d = areas.check(make_pr(files=files), rules)
        assert (d.action, d.evaluate) == (Action.LABEL, True)
        assert d.labels_add == ("area:spec", "area:engine", "area:other")

    def test_no_files_no_areas(self, rules):
        assert areas.check(make_pr(files=()), rules).labels_add == ()


# ---------------------------------------------------------------- intake: the combination


class TestIntake:
    def test_a_good_pr_is_evaluated_with_area_labels(self, rules):
        d = intake(make_pr(), rules, context())
        assert (d.evaluate, d.close, d.stopped_by, d.comment) == (True, False, None, ())
        assert (d.labels_add, d.labels_remove, d.areas) == (("area:kernels",), (), ("area:kernels",))
        assert d.claim.claimed_gain == pytest.approx(40.1 / 38.0 - 1)

    def test_drafts_come_first_even_before_the_blocklist(self, rules):
        d = intake(make_pr(draft=True, author="mallory"), rules, context(blocked=frozenset({"mallory"})))
        assert (d.evaluate, d.close, d.labels_add, d.labels_remove, d.comment) == (False, False, (), (), ())
        assert d.stopped_by == "drafts"

    def test_blocklist_closes_without_area_labels(self, rules):
        pr = make_pr(
            author="mallory", files=(FileChange("evalbot/x.py", "added", 1, 0),), body=FREE_TEXT_BODY
        )
        d = intake(pr, rules, context(blocked=frozenset({"mallory"})))
        assert (d.evaluate, d.close, d.stopped_by) == (False, True, "blocklist")
        assert d.labels_add == ("flagged:gaming",) and d.areas == ()
        assert [x.rule for x in d.decisions] == ["blocklist"]  # one reason: the most fundamental

    def test_sensitive_beats_cap_stale_and_template(self, rules):
        pr = make_pr(
            files=(FileChange("rules/tiers.yaml", "modified", 1, 1),),
            body=FREE_TEXT_BODY,
            created_at="2026-01-01T00:00:00Z",
        )
        d = intake(pr, rules, context(verdicts=(verdict(Status.REJECT),) * 5))
        assert d.stopped_by == "sensitive_paths"
        assert [x.rule for x in d.decisions] == ["sensitive_paths", "areas"]
        assert d.labels_add == ("area:other", "skipped:sensitive")

    def test_cap_then_stale_then_template_order(self, rules):
        older = tuple(make_pr(n, created_at=f"2026-11-0{n}T00:00:00Z") for n in range(1, 6))
        base = make_pr(body=FREE_TEXT_BODY, created_at="2026-11-20T00:00:00Z")
        exhausted = (verdict(Status.REJECT),) * 3
        assert intake(base, rules, context(open_prs=older, verdicts=exhausted)).stopped_by == "cap"
        assert intake(base, rules, context(verdicts=exhausted)).stopped_by == "stale"
        assert intake(base, rules, context()).stopped_by == "template"

    def test_maintainer_harness_pr_is_evaluated(self, rules):
        pr = make_pr(files=(FileChange("engine/cli.py", "modified", 1, 1),), author_association="MEMBER")
        d = intake(pr, rules, context())
        assert d.evaluate and d.labels_add == ("area:engine",)

    def test_labels_are_set_differences_over_intake_labels(self, rules):
        # It was stale and needed a benchmark; now it was pushed and filled in: those labels go, the
        # tier label (not intake's) stays, and an area label already there is not added again.
        pr = make_pr(labels=("stale", "needs-benchmark", "perf:S", "area:kernels", "area:engine"))
        d = intake(pr, rules, context(last_push_at="2026-11-30T08:00:00Z"))
        assert d.labels_add == () and d.labels_remove == ("area:engine", "needs-benchmark", "stale")
        assert "perf:S" not in rules.owned(LabelFamily.INTAKE) and "flagged:gaming" not in rules.owned(
            LabelFamily.INTAKE
        )

    def test_same_state_twice_changes_no_labels(self, rules):
        pr = make_pr(body=PLACEHOLDER_BODY)
        first = intake(pr, rules, context())
        again = intake(replace(pr, labels=first.labels_add), rules, context())
        assert first.labels_add == ("area:kernels", "needs-benchmark")
        assert (again.labels_add, again.labels_remove) == ((), ())
        assert again.comment == first.comment and "Benchmark needed" in said(again)

    def test_template_not_required_keeps_evaluating_with_comment(self, rules):
        tp = replace(rules.policy.template, require_benchmark=False)
        r = replace(rules, policy=replace(rules.policy, template=tp))
        d = intake(make_pr(body=NO_GAIN_BODY), r, context())
        assert d.evaluate and d.stopped_by is None
        assert [x.rule for x in d.decisions] == ["template", "areas"]
        assert d.labels_add == ("area:kernels", "needs-benchmark") and "no gain" in said(d)


def test_the_shipped_pr_template_is_the_one_the_rules_call_for():
    """`.github/PULL_REQUEST_TEMPLATE.md` is `evalbot rules pr-template rules/`: the bench commands of
    engine.yaml, a row per scored context, the sensitive paths of policy.yaml (a rules change that leaves
    the template behind fails here; regenerate it with that command)."""
    from pathlib import Path

    from click.testing import CliRunner

    from evalbot.cli import main

    root = Path(__file__).resolve().parents[2]
    got = CliRunner().invoke(main, ["rules", "pr-template", str(root / "rules")])
    assert got.exit_code == 0, got.output
    assert got.output == (root / ".github" / "PULL_REQUEST_TEMPLATE.md").read_text()
