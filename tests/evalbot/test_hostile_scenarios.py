"""No PR can stop, mislead or route around the bot: scenarios on the GitHub double with the real poller,
publisher, store and policy. The double answers as GitHub does (422 over 65,536 characters, the
250-commit listing, merge refusals, retargeting), so each test fails the way production would.

The evaluator here builds judgements from chosen gains (through the real verdict and receipt): these
tests are about the bot around a measurement, not the measurement.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from evalbot import judge
from evalbot.github import PyGithubAdapter
from evalbot.judge import Judgement
from evalbot.mirror import Mirror, MirrorError
from evalbot.model import (
    AccuracyResult,
    EvalRequest,
    Failure,
    Measurements,
    Provenance,
    Side,
    ThroughputPairs,
)
from evalbot.policy.template import parse_body
from evalbot.poller import Bot, BotSettings
from evalbot.poller.round_step import RoundStep
from evalbot.render import COMMENT_MAX_CHARS, MARKER, escape_md
from evalbot.rules import Rules, default_rules_dir, load_rules, rules_hash
from evalbot.store import Store
from evalbot.verdict.decide import decide
from tests.github_double.gitrepo import BareRepo, add_git_pull
from tests.github_double.state import Fault

pytest_plugins = ["tests.github_double.fixture"]

BOT = "evalbot[bot]"
BODY = """- [x] Tested: I ran the benchmark below on `main` and on this branch

| model | context | base tok/s | head tok/s | change |
|---|---|---|---|---|
| qwen2.5-coder-0.5b | 512 | 9.0 | {head} | {gain} |
"""


def body(gain: float) -> str:
    return BODY.format(head=round(9.0 * (1 + gain), 2), gain=f"+{gain:.0%}")


def pairs(gain: float, n: int = 10) -> tuple[tuple[float, float], ...]:
    """Quiet-box pairs whose geometric mean is 1 + gain (MDE well under the smallest tier)."""
    return tuple((10.0, 10.0 * (1 + gain) * math.exp(0.002 * (-1) ** i)) for i in range(n))


@dataclass
class Contest:
    """A repository on the double, its PRs, and a bot whose evaluator reads gains (or faults) per PR."""

    double: object
    repo: BareRepo
    rules: Rules
    gh: PyGithubAdapter
    store: Store
    bot: Bot
    tmp: Path
    gains: dict[int, float | Exception | Measurements] = field(default_factory=dict)
    calls: list[tuple[int, str, str]] = field(default_factory=list)

    @property
    def state(self):
        return self.double.state

    def pull(
        self,
        number: int,
        gain: float | Exception | Measurements,
        *,
        files: dict | None = None,
        author: str = "alice",
        pr_body: str | None = None,
        ci: str | None = "success",
        message: str | None = None,
    ) -> None:
        add_git_pull(
            self.state,
            self.repo,
            number,
            files or {f"engine/k{number}.py": f"speed = {number}\n"},
            author_login=author,
            author=(author.title(), f"{author}@example.com"),
            message=message,
            body=pr_body if pr_body is not None else body(gain if isinstance(gain, float) else 0.05),
        )
        self.gains[number] = gain
        if ci is not None:
            self.ci(number, ci)

    def ci(self, number: int, conclusion: str) -> None:
        """This repository's CI (ci.yml) ran on the PR's head and ended so."""
        run = self.state.start_run("ci.yml", f"pr-{number}", {}, event="pull_request")
        self.state.complete_run(run.id, conclusion)

    def bot_comment(self, number: int) -> str | None:
        return next(
            (c.body for c in self.state.comments_on(number) if c.author == BOT and MARKER in c.body), None
        )

    def labels(self, number: int) -> set[str]:
        return set(self.state.pulls[number].labels)


def make_judgement(rules: Rules, req: EvalRequest, what) -> Judgement:
    if isinstance(what, Exception):
        raise what
    if isinstance(what, Measurements):
        m = what
    else:
        prov = Provenance(
            repo="contest/engine",
            base_sha=req.base_sha,
            head_sha=req.head_sha,
            measured_sha=req.measured_sha or "",
            harness_sha=req.base_sha,
            rules_hash=req.rules_hash,
            profile=req.profile.name,
            pr=req.pr,
            title=req.title,
            author=req.author,
            model_sha256s={"m": "a" * 64},
            started_at="2026-12-01T00:00:00Z",
            finished_at="2026-12-01T00:10:00Z",
        )
        tps = tuple(ThroughputPairs("m", c, "decode_tps", pairs(what)) for c in (128, 512))
        m = Measurements(prov, throughput=tps, accuracy=(AccuracyResult("m", 128, 0.99, 0.001, 1.0),))
    v = decide(m, rules)
    return Judgement(m, v, judge.receipt(m, v, None))


@pytest.fixture
def contest(github_double, fake_clock, tmp_path) -> Contest:
    shipped = load_rules(default_rules_dir())
    rules = replace(shipped, automerge=replace(shipped.automerge, enabled=True))
    rules = replace(rules, rules_hash=rules_hash(rules))
    st = github_double.state
    st.add_workflow("ci.yml")
    repo = BareRepo.create(
        tmp_path / "remote.git", {"engine/model.py": "x = 1\n", "README.md": "r\n"}, when=st.now
    )
    st.clone_url = repo.url
    gh = PyGithubAdapter.from_token(github_double.repo, "ghp_test", base_url=github_double.base_url, pace=False,
                                    timeout=2.0, rng=random.Random(0), sleep=fake_clock.sleep,
                                    clock=fake_clock.time)  # fmt: skip
    store = Store(tmp_path / "state.db")
    c = Contest(github_double, repo, rules, gh, store, None, tmp_path)  # type: ignore[arg-type]

    def evaluator(req: EvalRequest, path: Path) -> Judgement:
        c.calls.append((req.pr, req.base_sha, req.head_sha))
        return make_judgement(rules, req, c.gains[req.pr])

    c.bot = Bot(
        gh,
        store,
        rules,
        BotSettings(bot_login=BOT, automerge_env=True),
        Mirror(repo.url, tmp_path / "mirror.git"),
        evaluator,
        lambda _m: None,
    )
    yield c
    store.close()


# ---------------------------------------------------------------- one PR never stops the poll


def test_the_double_refuses_a_comment_over_githubs_limit(contest):
    """The double answers like GitHub: 422 for 65,537 characters, so an untrimmed body fails here too."""
    contest.pull(1, 0.05)
    from evalbot.github import GitHubError

    with pytest.raises(GitHubError) as info:
        contest.gh.create_comment(1, "x" * (COMMENT_MAX_CHARS + 1))
    assert info.value.status == 422 and "too long" in str(info.value)
    assert contest.gh.create_comment(1, "x" * COMMENT_MAX_CHARS).id  # exactly the limit is fine


def test_a_record_with_5000_bad_fields_still_gives_a_comment_that_fits(contest):
    """A head whose output fails in 5,000 fields: the failure, the verdict and the hidden state stay small,
    the comment is posted, and the other PR is published in the same poll."""
    problems = "; ".join(f"field_{i:04d}: {'x' * 80!r} is not a number" for i in range(5000))
    failure = Failure(Side.HEAD, "serve", f"invalid engine output: {problems}", "tail\n" * 100_000)
    assert len(failure.message) <= 2000 and len(failure.log_tail) <= 8000
    prov = Provenance(
        repo="contest/engine",
        base_sha="a" * 40,
        head_sha="b" * 40,
        harness_sha="a" * 40,
        rules_hash=contest.rules.rules_hash,
        profile="cpu",
        pr=1,
    )
    contest.pull(1, Measurements(prov, failures=(failure,) * 30))
    contest.pull(2, 0.05)
    report = contest.bot.poll_once()
    assert not [n for n in report.notes if "failed" in n], report.notes
    first, second = contest.bot_comment(1), contest.bot_comment(2)
    assert first is not None and len(first) <= COMMENT_MAX_CHARS and "REJECT" in first
    assert second is not None and "PASS" in second


def test_a_body_over_the_limit_is_trimmed_with_a_note(contest):
    contest.pull(1, 0.05)
    long = MARKER + "\n" + "<details><summary>x</summary>\n\n```text\n" + "line\n" * 40_000
    assert contest.bot.publisher.comment(1, contest.state.pulls[1].head_sha, long)
    posted = contest.bot_comment(1)
    assert len(posted) <= COMMENT_MAX_CHARS and "Trimmed" in posted
    assert posted.count("```") % 2 == 0 and posted.count("<details>") == posted.count("</details>")


def test_an_unfetchable_head_is_that_prs_infra_error_and_the_others_are_published(contest, monkeypatch):
    contest.pull(1, 0.05)
    contest.pull(2, 0.06)
    real = Mirror.fetch_commit

    def flaky(self, sha, ref_hint=None):
        if ref_hint == "refs/pull/1/head":
            raise MirrorError(f"{self.remote} does not serve commit {sha} (ref {ref_hint})")
        return real(self, sha, ref_hint)

    monkeypatch.setattr(Mirror, "fetch_commit", flaky)
    report = contest.bot.poll_once()
    assert any(n.startswith("#1: evaluation failed: MirrorError") for n in report.notes), report.notes
    assert "infra error" in contest.bot_comment(1) and "does not serve commit" in contest.bot_comment(1)
    assert contest.rules.labels.infra_error in contest.labels(1)
    assert "PASS" in contest.bot_comment(2) and contest.state.pulls[2].merged  # published and merged


def test_an_evaluator_crash_is_that_prs_infra_error(contest):
    contest.pull(1, RuntimeError("the evaluator blew up"))
    contest.pull(2, 0.05)
    report = contest.bot.poll_once()
    assert any("RuntimeError: the evaluator blew up" in n for n in report.notes)
    [rec] = contest.store.queue.evaluations(pr=1)
    assert rec.state == "done" and rec.verdict.status.value == "INFRA_ERROR"
    assert "PASS" in contest.bot_comment(2)


def test_a_422_from_github_on_one_pr_does_not_stop_the_poll(contest):
    contest.pull(1, 0.05)
    contest.pull(2, 0.06)
    contest.bot.poll_once()  # both measured and published
    contest.state.push(1, contest.state.pulls[1].head_sha)  # nothing new, but the next comment edit fails
    contest.state.inject("labels.add", Fault("status", status=422))
    contest.state.pulls[1].labels.clear()  # a human removed every label: the bot must put them back
    contest.state.pulls[2].labels.clear()
    report = contest.bot.poll_once()
    assert any("failed: GitHubError" in n and "HTTP 422" in n for n in report.notes), report.notes
    assert contest.rules.labels.verified in contest.labels(1) | contest.labels(2)  # the other one was served


def test_a_file_name_that_is_not_utf8_in_main_does_not_stop_the_poll(contest, tmp_path):
    """main gains a file whose name is not UTF-8 (the copycat screen lists main's files)."""
    from evalbot.copycat.screen import CopycatScreen

    contest.repo.commit(
        "main",
        {"engine/\udcffbad.py": b"x = 1\n"},
        "odd name",
        author=("M", "m@e.com"),
        when=contest.state.tick(),
    )
    contest.state.refs["main"] = contest.repo.rev("main")
    contest.bot.screen = CopycatScreen(contest.store, contest.rules, contest.bot.mirror.path)
    contest.pull(1, 0.05)
    report = contest.bot.poll_once()
    assert not [n for n in report.notes if "failed" in n], report.notes
    assert "PASS" in contest.bot_comment(1)


def test_every_parser_of_pr_text_is_linear_on_a_65k_body():
    bodies = [
        "|" + " " * 65_000 + "\n" + " " * 65_000,
        "| base | head |\n|" + " " * 65_000 + "-",
        "| base | head |\n|---|---|\n| 1" + " " * 65_000 + "x | 2 |",
        "faster " + "1" * 65_000 + " %",
        "<!--" * 16_000,
        "|-" * 32_500,
        " " * 65_000 + "- [x]" + " " * 60_000,
        "```\n" * 16_000,
        "@" * 65_000,
        "https://" * 8_000,
        "#1" * 32_000,
    ]
    for text in bodies:
        t0 = time.perf_counter()
        parse_body(text)
        escape_md(text)
        assert time.perf_counter() - t0 < 0.5, repr(text[:20])


def test_each_body_is_parsed_once_per_poll(contest, monkeypatch):
    from evalbot.policy import template

    parsed: list[int] = []
    real = template.parse_body
    monkeypatch.setattr(template, "parse_body", lambda b: parsed.append(1) or real(b))
    contest.pull(1, 0.05)
    contest.bot.poll_once()
    assert len(parsed) == 1


# ---------------------------------------------------------------- merge only what was measured, where


def test_a_pr_retargeted_to_another_branch_is_never_merged_there(contest):
    contest.pull(1, 0.20)
    contest.bot.settings = replace(contest.bot.settings, automerge_env=False)
    contest.bot.poll_once()  # measured; auto-merge off for now
    contest.repo.git("branch", "release", "main")
    contest.state.refs["release"] = contest.repo.rev("release")
    contest.state.pulls[1].base_ref = "release"
    contest.bot.settings = replace(contest.bot.settings, automerge_env=True)
    report = contest.bot.poll_once()
    assert not contest.state.pulls[1].merged and report.merged == []


def test_main_moving_between_measurement_and_merge_means_measure_again(contest, monkeypatch):
    contest.pull(1, 0.20)
    real = RoundStep.maybe_merge

    def main_moves_first(self, pr, rec, *rest):
        contest.repo.commit(
            "main",
            {"README.md": "moved\n"},
            "maintainer push",
            author=("M", "m@e.com"),
            when=contest.state.tick(),
        )
        contest.state.refs["main"] = contest.repo.rev("main")
        return real(self, pr, rec, *rest)

    monkeypatch.setattr(RoundStep, "maybe_merge", main_moves_first)
    report = contest.bot.poll_once()
    assert not contest.state.pulls[1].merged and report.merged == []
    assert any("main moved since it was measured" in n for n in report.notes), report.notes
    queued = contest.store.queue.evaluations(pr=1, state="queued")
    assert [q.key.base_sha for q in queued] == [contest.repo.rev("main")]


def test_the_merged_winner_is_credited_in_the_track_it_led(contest):
    contest.pull(1, 0.20)
    contest.pull(2, 0.05)
    contest.bot.poll_once()
    assert contest.state.pulls[1].merged
    [credit] = contest.store.rounds.track_credits()
    assert (credit.track, credit.pr, credit.author) == ("decode", 1, contest.state.pulls[1].author)
    assert credit.gain is not None and credit.gain > 0.1


def test_an_unmergeable_winner_gives_way_to_the_next_pass(contest):
    contest.pull(1, 0.30)  # the round's winner, which GitHub will refuse
    contest.pull(2, 0.10)
    contest.state.set_mergeable(1, False)
    report = contest.bot.poll_once()
    assert not contest.state.pulls[1].merged and contest.state.pulls[2].merged, report.notes
    assert report.merged == [2]
    assert contest.rules.labels.needs_rebase in contest.labels(1)


def test_a_draft_never_reaches_a_round(contest):
    contest.pull(1, 0.30)
    contest.bot.settings = replace(contest.bot.settings, automerge_env=False)
    contest.bot.poll_once()
    assert contest.rules.labels.merge_first in contest.labels(1)
    contest.state.pulls[1].draft = True
    contest.bot.settings = replace(contest.bot.settings, automerge_env=True)
    report = contest.bot.poll_once()
    assert not contest.state.pulls[1].merged and report.merged == []


def test_the_measured_sha_is_named_in_the_receipt_and_report(contest):
    contest.pull(1, 0.05)
    contest.bot.settings = replace(contest.bot.settings, automerge_env=False)
    contest.bot.poll_once()
    [rec] = contest.store.queue.evaluations(pr=1, state="done")
    assert rec.receipt["body"]["measured_sha"] == rec.measurements.provenance.measured_sha
    assert rec.receipt["body"]["head_sha"] == contest.state.pulls[1].head_sha
    assert "measured `" in contest.bot_comment(1)


def test_auto_merge_needs_green_ci_on_the_measured_head(contest):
    contest.pull(1, 0.20, ci=None)
    report = contest.bot.poll_once()
    assert not contest.state.pulls[1].merged
    assert any("CI (ci.yml) has not run on the measured head" in n for n in report.notes), report.notes
    contest.ci(1, "failure")
    assert not contest.state.pulls[1].merged and contest.bot.poll_once().merged == []
    contest.ci(1, "success")
    assert contest.bot.poll_once().merged == [1]


def test_a_pr_that_changes_the_tests_waits_for_a_maintainer(contest):
    contest.pull(1, 0.20, files={"engine/k1.py": "speed = 1\n", "tests/test_speed.py": "def test(): pass\n"})
    report = contest.bot.poll_once()
    assert not contest.state.pulls[1].merged
    assert any("maintainer-approved" in n for n in report.notes), report.notes
    assert "Needs a maintainer before it merges" in contest.bot_comment(
        1
    ) and "tests/test\\_speed.py" in contest.bot_comment(1)
    contest.state.pulls[1].labels.append("maintainer-approved")  # a maintainer looked at the test change
    assert contest.bot.poll_once().merged == [1]


# ---------------------------------------------------------------- labels, comments and maintainers' hands


def test_what_the_bot_owns_it_restores(contest):
    contest.pull(1, 0.05)
    contest.bot.settings = replace(contest.bot.settings, automerge_env=False)
    contest.bot.poll_once()
    assert contest.rules.labels.verified in contest.labels(1)
    contest.state.pulls[1].labels.remove(contest.rules.labels.verified)  # a human removed it
    for cid in [c.id for c in contest.state.comments_on(1)]:
        del contest.state.comments[cid]  # and deleted the bot's comment
    contest.bot.poll_once()
    assert contest.rules.labels.verified in contest.labels(1)
    assert contest.bot_comment(1) is not None and "PASS" in contest.bot_comment(1)


class CleanScreen:
    """A copycat screen (evalbot.copycat.Screen) that finds every PR clean: it removes the screen's labels."""

    def __init__(self, rules):
        self.rules, self.mains, self.merged = rules, [], []

    def __call__(self, pr):
        from evalbot.model import Decision

        return Decision((), (self.rules.labels.copycat, self.rules.labels.copycat_warn))

    def set_main(self, sha):
        self.mains.append(sha)

    def mark_merged(self, pr, at):
        self.merged.append(pr)


def test_a_maintainers_blocking_label_wins_over_the_screens(contest):
    lab = contest.rules.labels
    contest.bot.screen = screen = CleanScreen(contest.rules)
    contest.pull(1, 0.30)
    contest.state.pulls[1].labels.append(lab.copycat)  # a maintainer's judgement
    report = contest.bot.poll_once()
    assert lab.copycat in contest.labels(1) and not contest.state.pulls[1].merged
    assert any("blocking label" in n for n in report.notes), report.notes
    assert screen.mains == [report.main_sha] and screen.merged == []  # told of main, and nothing merged


def test_a_hold_label_keeps_the_bot_away(contest):
    contest.pull(1, 0.30)
    contest.state.pulls[1].labels.append(contest.rules.labels.hold)
    report = contest.bot.poll_once()
    assert contest.calls == [] and not contest.state.pulls[1].merged and "#1: on hold" in report.notes


def test_claim_gap_is_applied_and_blocks_the_merge(contest):
    contest.pull(1, 0.25, pr_body=body(2.0))  # claims +200%, measures +25%
    report = contest.bot.poll_once()
    assert contest.rules.labels.claim_gap in contest.labels(1)
    assert not contest.state.pulls[1].merged and any("claim-gap" in n for n in report.notes)


def test_a_closed_blocked_pr_stays_closed(contest):
    contest.store.moderation.block("mallory", "copied three PRs", "maintainer")
    contest.pull(1, 0.30, author="mallory")
    contest.bot.poll_once()
    assert contest.state.pulls[1].state == "closed"
    contest.state.pulls[1].state = "open"  # the contributor reopens it
    contest.bot.poll_once()
    assert contest.state.pulls[1].state == "closed" and contest.calls == []


def test_a_clear_exempts_one_head_only(contest):
    contest.store.moderation.block("mallory", "copied three PRs", "maintainer")
    contest.pull(1, 0.05, author="mallory")
    contest.store.moderation.add_clear(
        1, "maintainer", "mallory's own work", head_sha=contest.state.pulls[1].head_sha
    )
    contest.bot.settings = replace(contest.bot.settings, automerge_env=False)
    contest.bot.poll_once()
    assert contest.state.pulls[1].state == "open" and [c[0] for c in contest.calls] == [1]
    from tests.github_double.gitrepo import push_git_commit

    push_git_commit(contest.state, contest.repo, 1, {"engine/k1.py": "speed = 2\n"})
    contest.bot.poll_once()
    assert contest.state.pulls[1].state == "closed"  # the new head is screened again


def test_co_authored_by_trailers_count_for_the_blocklist(contest):
    contest.store.moderation.block("mallory", "copied three PRs", "maintainer")
    contest.pull(
        1, 0.30, message="Faster decode\n\nCo-authored-by: M <12345+mallory@users.noreply.github.com>"
    )
    contest.pull(2, 0.30, author="bob", message="Faster\n\nCo-authored-by: mallory <m@example.com>")
    contest.bot.poll_once()
    assert contest.state.pulls[1].state == "closed" and contest.state.pulls[2].state == "closed"
    assert contest.calls == []


def test_a_pr_listed_in_part_is_never_evaluated(contest):
    contest.pull(1, 0.30)
    contest.state.commits_cap = 0  # GitHub lists at most 250 commits; this PR has more than the cap
    report = contest.bot.poll_once()
    assert contest.calls == [] and not contest.state.pulls[1].merged
    assert "squash" in contest.bot_comment(1), report.notes
