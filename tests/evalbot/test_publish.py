"""Publishing against the GitHub double: one comment edited in place, labels as a set difference, merges
at the measured sha, and a crash between intent and completion reconciled without repeating anything."""

from __future__ import annotations

import hashlib
import random

import pytest

from evalbot.github import PyGithubAdapter
from evalbot.model import MergeOutcome
from evalbot.publish import Publisher, bot_comment, plan_labels
from evalbot.render import MARKER
from evalbot.store import Store, action_key
from tests.github_double.state import CommentState, fake_sha

pytest_plugins = ["tests.github_double.fixture"]  # github_double, fake_clock

BOT = "evalbot[bot]"


@pytest.fixture
def gh(github_double, fake_clock):
    return PyGithubAdapter.from_token(
        github_double.repo,
        "ghp_test",
        base_url=github_double.base_url,
        pace=False,
        timeout=2.0,
        rng=random.Random(0),
        sleep=fake_clock.sleep,
        clock=fake_clock.time,
    )


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "state.db") as s:
        yield s


def publisher(gh, store, log=None):
    return Publisher(gh, store, bot_login=BOT, log=(log if log is not None else []).append)


def test_plan_labels_touches_only_bot_labels():
    change = plan_labels(
        ["perf:S", "help wanted", "regression"], ["perf:M"], ["perf:S", "perf:M", "regression"]
    )
    assert change.add == ("perf:M",) and change.remove == ("perf:S", "regression")
    assert not plan_labels(["perf:M", "x"], ["perf:M"], ["perf:M"])


def test_one_comment_edited_in_place_and_a_users_copy_of_the_marker_ignored(github_double, gh, store):
    github_double.state.add_pull(1)
    st = github_double.state
    fake = CommentState(st.new_id(), 1, "mallory", f"{MARKER}\nPASS XL, trust me", st.iso(), st.iso())
    st.comments[fake.id] = fake  # a user pasting the bot's marker into their own comment
    pub = publisher(gh, store)
    head = github_double.state.pulls[1].head_sha
    assert pub.comment(1, head, f"{MARKER}\nfirst")
    assert not pub.comment(1, head, f"{MARKER}\nfirst")  # same text: nothing to do
    assert pub.comment(1, head, f"{MARKER}\nsecond")
    assert pub.comment(1, head, f"{MARKER}\nfirst")  # A -> B -> A is still an edit
    mine = [c for c in github_double.state.comments_on(1) if c.author == BOT]
    assert len(mine) == 1 and mine[0].body.endswith("first")
    assert st.comments[fake.id].body.endswith("trust me")  # never edited


def test_labels_are_a_set_difference_and_merge_uses_the_measured_sha(github_double, gh, store):
    pull = github_double.state.add_pull(2, labels=["perf:S", "keep-me"])
    pub = publisher(gh, store)
    change = pub.labels(
        2, pull.head_sha, ["perf:S", "keep-me"], ["perf:M", "verified"], ["perf:S", "perf:M", "verified"]
    )
    assert change.add == ("perf:M", "verified") and change.remove == ("perf:S",)
    assert sorted(gh.get_pull(2).labels) == ["keep-me", "perf:M", "verified"]
    measured = pull.head_sha
    github_double.state.push(2, fake_sha("moved", 2))
    result = pub.merge(2, measured, "squash", "t", "m")
    assert result is not None and result.outcome is MergeOutcome.HEAD_MOVED and not gh.get_pull(2).merged
    assert not store.actions.pending_actions()  # nothing happened: the merge may be tried again later


def test_a_crash_between_intent_and_completion_is_reconciled_not_repeated(github_double, gh, store):
    github_double.state.add_pull(3)
    head = github_double.state.pulls[3].head_sha
    body = f"{MARKER}\nverdict"
    # what a bot killed right after GitHub answered leaves behind: the intent, and the comment on GitHub
    digest = hashlib.sha256(body.encode()).hexdigest()[:16]
    store.actions.begin_action(
        action_key("comment", 3, head, {"from": None, "to": digest}), {"pr": 3, "body_digest": digest}
    )
    made = gh.create_comment(3, body)
    # and a label change whose call never reached GitHub
    store.actions.begin_action(
        action_key("labels", 3, head, "x"), {"pr": 3, "add": ["verified"], "remove": []}
    )
    log: list[str] = []
    notes = publisher(gh, store, log).reconcile()
    assert sorted(notes) == ["comment #3: done", "labels #3: not done, will redo"]
    assert not store.actions.pending_actions()
    assert not publisher(gh, store).comment(3, head, body)  # already there: no second comment
    assert [c.id for c in github_double.state.comments_on(3)] == [made.id]
    assert bot_comment(gh.list_comments(3), None).body == body


def test_apply_acts_on_one_decision_once_and_never_takes_off_a_protected_label(github_double, gh, store):
    """The one applier: the family's labels as a set difference (less the protected ones), the notice as
    the one bot comment, then the close; applied again, it changes nothing on GitHub."""
    from evalbot.model import Decision, Notice

    pull = github_double.state.add_pull(3, labels=["copycat-warn", "copycat", "keep-me"])
    pub = publisher(gh, store)
    pr = gh.get_pull(3)
    decision = Decision(
        ("copycat",),
        ("copycat", "copycat-warn"),
        False,
        Notice("screen", "copycat", ("90% of this PR's code is in #1 <script>",)),
        close="copycat",
    )
    after = pub.apply(pr, decision, pr.labels, protected={"copycat-warn"})  # a maintainer's label stays
    assert after == {"copycat", "copycat-warn", "keep-me"} and set(gh.get_pull(3).labels) == after
    assert gh.get_pull(3).state == "closed"
    (mine,) = [c for c in github_double.state.comments_on(3) if c.author == BOT]
    assert MARKER in mine.body and "90% of this PR" in mine.body and "<script>" not in mine.body  # escaped
    calls = len(github_double.state.requests)
    pub.apply(gh.get_pull(3), decision, after, protected={"copycat-warn"})
    writes = [r for r in github_double.state.requests[calls:] if r.method != "GET"]
    assert writes == [] and pull.head_sha == gh.get_pull(3).head_sha
