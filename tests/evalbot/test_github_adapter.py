"""The PyGithub adapter against the GitHub double: facts, conditional polling, faults, merges, Actions."""

from __future__ import annotations

import random
import re

import github
import pytest

from evalbot.github import ArtifactRejected, GitHubError, GitHubUnavailable, PyGithubAdapter
from evalbot.github_retry import RetryPolicy
from evalbot.model import MergeOutcome
from tests.github_double.gitrepo import BareRepo, add_git_pull, push_git_commit
from tests.github_double.serve import Double, FakeClock
from tests.github_double.state import Fault, FileState, zip_bytes

pytest_plugins = ["tests.github_double.fixture"]  # github_double, fake_clock

TOKEN = "ghp_test_token"


def make_adapter(double: Double, clock: FakeClock, **options) -> PyGithubAdapter:
    options = {"timeout": 0.2, "rng": random.Random(0)} | options
    return PyGithubAdapter.from_token(
        double.repo,
        TOKEN,
        base_url=double.base_url,
        pace=False,
        sleep=clock.sleep,
        clock=clock.time,
        **options,
    )


@pytest.fixture
def adapter(github_double, fake_clock):
    return make_adapter(github_double, fake_clock)


@pytest.fixture
def git_repo(tmp_path, github_double):
    files = {
        "engine/generate.py": "def decode():\n    return slow()\n",
        "README.md": "engine\n",
        "old_name.py": "x = 1\n",
    }
    return BareRepo.create(tmp_path / "engine.git", files, when=github_double.state.tick())


# --- facts ---


def test_list_open_pulls_returns_open_prs_newest_update_first(github_double, adapter):
    s = github_double.state
    s.add_pull(1, author="alice", draft=True, labels=["perf"])
    s.add_pull(2, author="bob", author_association="FIRST_TIME_CONTRIBUTOR")
    s.add_pull(3, author="carol", state="closed")
    s.push(1, "a" * 40)
    pulls = adapter.list_open_pulls()
    assert [p.number for p in pulls] == [1, 2]
    first, second = pulls
    assert (first.author, first.draft, first.labels, first.head_sha, first.base_ref) == (
        "alice",
        True,
        ("perf",),
        "a" * 40,
        "main",
    )
    assert (second.author_association, second.state, second.merged, second.files) == (
        "FIRST_TIME_CONTRIBUTOR",
        "open",
        False,
        (),
    )


def test_idle_poll_sends_the_etag_gets_304_and_spends_no_rate_limit(github_double, adapter):
    s = github_double.state
    s.add_pull(1)
    assert [p.number for p in adapter.list_open_pulls()] == [1]
    remaining = s.rate_remaining
    assert adapter.list_open_pulls() is None
    first, idle = s.calls("pulls.list")
    assert "if-none-match" not in first.headers
    assert idle.status == 304 and idle.headers["if-none-match"]
    assert s.rate_remaining == remaining
    s.add_pull(2)
    assert [p.number for p in adapter.list_open_pulls()] == [2, 1]
    assert s.calls("pulls.list")[-1].status == 200
    assert [p.number for p in adapter.list_open_pulls(force=True)] == [2, 1]
    assert "if-none-match" not in s.calls("pulls.list")[-1].headers


def test_a_label_change_on_an_open_pr_ends_the_idle_streak(github_double, adapter):
    github_double.state.add_pull(1)
    adapter.list_open_pulls()
    assert adapter.list_open_pulls() is None
    adapter.add_labels(1, ["tier-1"])
    assert adapter.list_open_pulls()[0].labels == ("tier-1",)


def test_all_pages_of_open_prs_are_read_and_a_failed_page_does_not_store_the_etag(github_double, fake_clock):
    s = github_double.state
    for n in range(1, 106):
        s.add_pull(n)
    adapter = make_adapter(github_double, fake_clock, policy=RetryPolicy(attempts=2))
    s.inject("pulls.list", Fault.passthrough(), Fault.server_error(), Fault.server_error())
    with pytest.raises(GitHubUnavailable, match="gave up after 2 attempts"):
        adapter.list_open_pulls()
    pulls = adapter.list_open_pulls()  # not "unchanged": the failed poll must not have kept its ETag
    assert len(pulls) == 105 and len({p.number for p in pulls}) == 105
    assert "if-none-match" not in s.calls("pulls.list")[3].headers


def test_get_pull_from_real_git_has_patches_renames_binaries_and_commit_people(
    github_double, adapter, git_repo
):
    s = github_double.state
    files = {
        "engine/generate.py": "def decode():\n    return fast()\n",
        "README.md": None,
        "new_name.py": "x = 1\n",
        "old_name.py": None,
        "kernels/table.bin": b"\x00\x01\x02\xff" * 8,
        "engine/cache.py": "CACHE = {}\n",
    }
    pull = add_git_pull(s, git_repo, 7, files, author_login="octo", title="Faster decode")
    push_git_commit(
        s,
        git_repo,
        7,
        {"engine/cache.py": "CACHE = {}\nSIZE = 4\n"},
        author=("Ghost Writer", "ghost@nowhere.invalid"),
    )
    facts = adapter.get_pull(7)
    assert (facts.number, facts.title, facts.author, facts.base_sha) == (
        7,
        "Faster decode",
        "octo",
        pull.base_sha,
    )
    assert facts.head_sha == git_repo.rev("pr-7") and facts.incomplete == ()
    by_path = {f.path: f for f in facts.files}
    generate = by_path["engine/generate.py"]
    assert (generate.status, generate.additions, generate.deletions) == ("modified", 1, 1)
    assert (
        generate.patch.startswith("@@ -1,2 +1,2 @@")
        and "-    return slow()" in generate.patch
        and "+    return fast()" in generate.patch
    )
    assert by_path["README.md"].status == "removed"
    assert (by_path["new_name.py"].status, by_path["new_name.py"].previous_path) == ("renamed", "old_name.py")
    assert (by_path["kernels/table.bin"].patch, by_path["kernels/table.bin"].additions) == ("", 0)
    assert (by_path["engine/cache.py"].status, by_path["engine/cache.py"].additions) == ("added", 2)
    assert "old_name.py" in facts.paths
    first, second = facts.commits
    assert (first.author, first.committer, first.author_name) == ("octo", "octo", "Octo Cat")
    assert (second.sha, second.author, second.author_name) == (facts.head_sha, None, "Ghost Writer")


def test_files_and_commits_are_read_across_pages(github_double, adapter):
    files = [FileState(f"src/f{i}.py", "added", 1, 0, "@@ -0,0 +1 @@\n+x") for i in range(250)]
    github_double.state.add_pull(1, files=files)
    facts = adapter.get_pull(1)
    assert [f.path for f in facts.files] == [f"src/f{i}.py" for i in range(250)]
    assert len(github_double.state.calls("pulls.files")) == 3


def test_a_listing_cut_by_github_is_reported_as_incomplete(github_double, adapter):
    s = github_double.state
    s.add_pull(1, files=[FileState(f"f{i}", "added", 1, 0, "@@ -0,0 +1 @@\n+x") for i in range(4)])
    s.push(1, "b" * 40)
    s.files_cap, s.commits_cap = 3, 1
    facts = adapter.get_pull(1)
    assert len(facts.files) == 3 and len(facts.commits) == 1
    assert facts.incomplete == (
        "GitHub listed 3 of the PR's 4 changed files",
        "GitHub listed 1 of the PR's 2 commits",
    )


def test_an_omitted_patch_is_fetched_through_the_hook_or_reported(github_double, fake_clock):
    huge = FileState("data/huge.txt", "modified", 5000, 10, None)
    github_double.state.add_pull(1, files=[huge, FileState("img.png", "added", 0, 0, None)])
    asked = []

    def fetch(base, head, path):
        asked.append((base, head, path))
        return "@@ -1 +1 @@\n-a\n+b"

    facts = make_adapter(github_double, fake_clock, git_patch_fetcher=fetch).get_pull(1)
    pull = github_double.state.pulls[1]
    assert asked == [(pull.base_sha, pull.head_sha, "data/huge.txt")]  # not the binary file
    assert facts.files[0].patch == "@@ -1 +1 @@\n-a\n+b" and facts.incomplete == ()
    plain = make_adapter(github_double, fake_clock).get_pull(1)
    assert plain.incomplete == ("GitHub omitted the patch of 1 file(s): data/huge.txt",)


def test_facts_whose_commits_end_elsewhere_than_the_head_are_refused(github_double, adapter):
    s = github_double.state
    s.add_pull(1)
    s.pulls[1].head_sha = "c" * 40  # as if a push landed between the PR read and the commits read, every time
    with pytest.raises(GitHubUnavailable, match="head kept moving"):
        adapter.get_pull(1)
    assert len(s.calls("pulls.get")) == 3


def test_an_unknown_pr_is_a_refusal_not_an_outage(github_double, adapter, fake_clock):
    with pytest.raises(
        GitHubError, match=r"GET /repos/contest/engine/pulls/99: HTTP 404: Not Found"
    ) as caught:
        adapter.get_pull(99)
    assert not isinstance(caught.value, GitHubUnavailable) and caught.value.status == 404
    assert fake_clock.sleeps == [] and len(github_double.state.calls("pulls.get")) == 1


# --- faults ---


def test_502s_are_retried_with_jittered_backoff(github_double, adapter, fake_clock):
    github_double.state.add_pull(1)
    github_double.state.inject("pulls.get", Fault.server_error(502), Fault.server_error(503))
    assert adapter.get_pull(1).number == 1
    assert [r.status for r in github_double.state.calls("pulls.get")] == [502, 503, 200]
    first, second = fake_clock.sleeps
    assert 0.5 <= first <= 1.0 and 1.0 <= second <= 2.0


def test_a_timeout_and_a_dropped_connection_are_retried(github_double, adapter, fake_clock):
    github_double.state.add_pull(1)
    github_double.state.inject("pulls.files", Fault.timeout(1.0), Fault.disconnect())
    assert adapter.get_pull(1).files[0].path == "engine/generate.py"
    assert [r.status for r in github_double.state.calls("pulls.files")] == [0, 0, 200]
    assert len(fake_clock.sleeps) == 2


def test_a_secondary_rate_limit_waits_what_retry_after_says(github_double, adapter, fake_clock):
    github_double.state.add_pull(1)
    github_double.state.inject("pulls.list", Fault.secondary_limit(37), Fault.secondary_limit(5, status=429))
    assert [p.number for p in adapter.list_open_pulls()] == [1]
    assert fake_clock.sleeps == [37.0, 5.0]


def test_a_primary_rate_limit_waits_until_the_reset(github_double, adapter, fake_clock):
    github_double.state.add_pull(1)
    github_double.state.inject("pulls.get", Fault.primary_limit(reset_at=int(fake_clock.now) + 120))
    assert adapter.get_pull(1).number == 1
    assert fake_clock.sleeps == [121.0]


def test_rate_limits_past_the_cap_make_github_unavailable(github_double, fake_clock):
    github_double.state.add_pull(1)
    adapter = make_adapter(github_double, fake_clock, policy=RetryPolicy(max_rate_wait=600))
    github_double.state.inject("pulls.get", *[Fault.secondary_limit(250)] * 3)
    with pytest.raises(
        GitHubUnavailable,
        match=r"secondary rate limit: GitHub asks for 250s more after 500s waited, past the cap of 600s",
    ):
        adapter.get_pull(1)
    assert fake_clock.sleeps == [250.0, 250.0]
    github_double.state.inject("pulls.get", Fault.primary_limit(reset_at=int(fake_clock.now) + 3600))
    with pytest.raises(GitHubUnavailable, match="primary rate limit"):
        adapter.get_pull(1)


def test_persistent_server_errors_give_up_after_the_attempts(github_double, fake_clock):
    github_double.state.add_pull(1)
    github_double.state.inject("pulls.get", *[Fault.server_error()] * 10)
    adapter = make_adapter(github_double, fake_clock, policy=RetryPolicy(attempts=3))
    with pytest.raises(
        GitHubUnavailable, match=r"HTTP 502: Server Error \(gave up after 3 attempts\)"
    ) as caught:
        adapter.get_pull(1)
    assert caught.value.status == 502
    assert len(github_double.state.calls("pulls.get")) == 3 and len(fake_clock.sleeps) == 2


def test_a_comment_is_not_posted_twice_after_an_ambiguous_fault(github_double, adapter, fake_clock):
    github_double.state.add_pull(1)
    github_double.state.inject("comments.create", Fault.server_error())
    with pytest.raises(GitHubUnavailable, match="not retried: it may have been applied"):
        adapter.create_comment(1, "hello")
    assert len(github_double.state.calls("comments.create")) == 1 and fake_clock.sleeps == []
    github_double.state.inject("comments.create", Fault.secondary_limit(3))
    adapter.create_comment(1, "hello")  # a rate-limit refusal applied nothing, so it is retried
    assert [c.body for c in github_double.state.comments_on(1)] == ["hello"]


def test_pygithubs_own_retry_is_off_even_for_a_client_built_with_its_defaults(github_double, fake_clock):
    gh = github.Github(  # PyGithub's default GithubRetry, which would sleep on 403s and 5xx by itself
        auth=github.Auth.Token(TOKEN), base_url=github_double.base_url, seconds_between_requests=None
    )
    adapter = PyGithubAdapter(
        github_double.repo, gh, sleep=fake_clock.sleep, clock=fake_clock.time, rng=random.Random(0)
    )
    github_double.state.add_pull(1)
    github_double.state.inject("pulls.get", Fault.server_error(), Fault.secondary_limit(9))
    assert adapter.get_pull(1).number == 1
    assert (
        len(github_double.state.calls("pulls.get")) == 3
        and len(fake_clock.sleeps) == 2
        and fake_clock.sleeps[1] == 9.0
    )
    assert github_double.state.calls("pulls.get")[0].headers["authorization"] == f"token {TOKEN}"


# --- merging ---


def test_merge_passes_the_measured_sha(github_double, adapter):
    github_double.state.add_pull(1)
    measured = github_double.state.pulls[1].head_sha
    result = adapter.merge(1, measured, "squash", title="Faster decode (#1)", message="Tier 2")
    assert (
        result.outcome is MergeOutcome.MERGED and result.sha == github_double.state.pulls[1].merge_commit_sha
    )
    (call,) = github_double.state.calls("pulls.merge")
    assert call.body == {
        "sha": measured,
        "merge_method": "squash",
        "commit_title": "Faster decode (#1)",
        "commit_message": "Tier 2",
    }
    assert github_double.state.pulls[1].merged


def test_a_head_that_moved_after_measurement_is_not_merged(github_double, adapter):
    github_double.state.add_pull(1)
    measured = github_double.state.pulls[1].head_sha
    github_double.state.push(1, "d" * 40)
    result = adapter.merge(1, measured)
    assert result.outcome is MergeOutcome.HEAD_MOVED
    assert result.message == "Head branch was modified. Review and try the merge again."
    assert not github_double.state.pulls[1].merged and github_double.state.pulls[1].state == "open"


def test_an_unmergeable_pr_is_a_result_and_a_bad_request_never_leaves(github_double, adapter):
    github_double.state.add_pull(1)
    github_double.state.set_mergeable(1, False)
    head = github_double.state.pulls[1].head_sha
    assert adapter.merge(1, head).outcome is MergeOutcome.NOT_MERGEABLE
    assert adapter.merge(1, head, "rebase").message == "Rebase merges are not allowed on this repository."
    with pytest.raises(ValueError, match="merge method must be one of"):
        adapter.merge(1, head, "fast-forward")
    with pytest.raises(ValueError, match="full 40-hex head sha"):
        adapter.merge(1, head[:7])
    assert len(github_double.state.calls("pulls.merge")) == 2


def test_a_merge_that_timed_out_is_not_retried(github_double, adapter, fake_clock):
    github_double.state.add_pull(1)
    github_double.state.inject("pulls.merge", Fault.disconnect())
    with pytest.raises(GitHubUnavailable, match="may have been applied"):
        adapter.merge(1, github_double.state.pulls[1].head_sha)
    assert len(github_double.state.calls("pulls.merge")) == 1 and fake_clock.sleeps == []


def test_a_squash_merge_of_a_git_backed_pr_really_moves_main(github_double, adapter, git_repo):
    old_main = git_repo.rev("main")
    pull = add_git_pull(
        github_double.state, git_repo, 3, {"engine/generate.py": "def decode():\n    return fast()\n"}
    )
    result = adapter.merge(3, pull.head_sha, "squash", title="Faster decode (#3)")
    assert result.outcome is MergeOutcome.MERGED and git_repo.rev("main") == result.sha
    assert git_repo.git("rev-list", "--parents", "-n1", result.sha).split() == [result.sha, old_main]
    assert git_repo.git("show", f"{result.sha}:engine/generate.py") == "def decode():\n    return fast()"
    assert git_repo.git("log", "-1", "--format=%s", result.sha) == "Faster decode (#3)"


# --- comments, labels, state, statuses ---


def test_comments_are_created_edited_and_listed(github_double, adapter):
    github_double.state.add_pull(1)
    created = adapter.create_comment(1, "<!-- evalbot -->\nqueued")
    assert (created.author, created.body) == ("evalbot[bot]", "<!-- evalbot -->\nqueued")
    edited = adapter.edit_comment(created.id, "<!-- evalbot -->\nPASS")
    assert (edited.id, edited.body) == (created.id, "<!-- evalbot -->\nPASS")
    assert edited.updated_at > created.updated_at
    adapter.create_comment(1, "second")
    assert [(c.id, c.body) for c in adapter.list_comments(1)] == [
        (created.id, "<!-- evalbot -->\nPASS"),
        (created.id + 1, "second"),
    ]
    assert (
        github_double.state.calls("comments.edit")[0].path
        == f"/repos/contest/engine/issues/comments/{created.id}"
    )


def test_labels_are_added_and_removed(github_double, adapter):
    github_double.state.add_pull(1, labels=["queued"])
    assert adapter.add_labels(1, ["tier: 2", "perf/decode"]) == ("queued", "tier: 2", "perf/decode")
    adapter.remove_label(1, "tier: 2")
    adapter.remove_label(1, "never-there")  # absent is fine: removal is idempotent
    assert github_double.state.pulls[1].labels == ["queued", "perf/decode"]
    assert [r.path for r in github_double.state.calls("labels.remove")] == [
        "/repos/contest/engine/issues/1/labels/tier%3A%202",
        "/repos/contest/engine/issues/1/labels/never-there",
    ]


def test_close_and_reopen(github_double, adapter):
    github_double.state.add_pull(1)
    adapter.close(1)
    assert github_double.state.pulls[1].state == "closed"
    adapter.reopen(1)
    assert github_double.state.pulls[1].state == "open"
    adapter.merge(1, github_double.state.pulls[1].head_sha)
    with pytest.raises(GitHubError, match="HTTP 422: A merged pull request cannot be reopened"):
        adapter.reopen(1)


def test_commit_statuses_are_set_with_descriptions_cut_to_githubs_limit(github_double, adapter):
    sha = "e" * 40
    adapter.create_status(
        sha, "pending", "evalbot/speed", "measuring " + "x" * 200, "https://example.invalid/run/1"
    )
    adapter.create_status(sha, "success", "evalbot/speed")
    first, second = github_double.state.statuses
    assert (first.state, first.context, first.target_url) == (
        "pending",
        "evalbot/speed",
        "https://example.invalid/run/1",
    )
    assert len(first.description) == 140 and first.description.endswith("…")
    assert (second.state, second.description, second.target_url) == ("success", "", None)
    with pytest.raises(ValueError, match="error, failure, pending or success"):
        adapter.create_status(sha, "passed", "evalbot/speed")


# --- actions ---


def test_dispatch_find_the_run_and_download_its_artifact(github_double, adapter, tmp_path):
    s = github_double.state
    s.add_workflow("speed.yml")
    s.add_pull(5)
    head = s.pulls[5].head_sha
    run_id = adapter.dispatch_workflow("speed.yml", "pr-5", {"pr": "5", "head_sha": head})
    (dispatch,) = s.calls("workflows.dispatch")
    assert dispatch.body == {
        "ref": "pr-5",
        "inputs": {"pr": "5", "head_sha": head},
        "return_run_details": True,
    }
    (run,) = adapter.list_workflow_runs("speed.yml", head_sha=head)
    assert (run.id, run.head_sha, run.status, run.conclusion, run.event) == (
        run_id,
        head,
        "queued",
        None,
        "workflow_dispatch",
    )
    assert adapter.list_workflow_runs("speed.yml", head_sha="f" * 40) == ()
    s.complete_run(
        run_id, "success", {"measurements": {"result.json": '{"decode_tps": 41.5}', "logs/build.txt": "ok\n"}}
    )
    assert adapter.get_workflow_run(run_id).conclusion == "success"
    assert [r.id for r in adapter.list_workflow_runs(status="completed")] == [run_id]
    (artifact,) = adapter.list_run_artifacts(run_id)
    assert (artifact.name, artifact.run_id, artifact.expired) == ("measurements", run_id, False)
    folder = adapter.download_artifact(artifact.id, tmp_path)
    assert folder == tmp_path / f"artifact-{artifact.id}"
    assert (folder / "result.json").read_text() == '{"decode_tps": 41.5}' and (
        folder / "logs" / "build.txt"
    ).exists()
    (redirect,), (blob,) = s.calls("artifacts.zip"), s.calls("blobs.get")
    assert redirect.status == 302 and redirect.headers["authorization"] == f"token {TOKEN}"
    assert "authorization" not in blob.headers  # the token never travels to the storage host


def test_a_dispatch_answered_204_returns_no_run_id_and_bad_targets_are_refused(github_double, adapter):
    s = github_double.state
    s.add_workflow("speed.yml")
    s.add_pull(5)
    s.run_details_supported = False  # GitHub servers from before return_run_details answer 204
    assert adapter.dispatch_workflow("speed.yml", "pr-5", {"pr": "5"}) is None
    assert s.calls("workflows.dispatch")[0].status == 204
    assert [r.inputs for r in s.runs.values()] == [{"pr": "5"}]
    with pytest.raises(GitHubError, match="HTTP 422: No ref found for: nowhere"):
        adapter.dispatch_workflow("speed.yml", "nowhere", {})
    with pytest.raises(GitHubError, match=re.escape("missing.yml/dispatches: HTTP 404: Not Found")):
        adapter.dispatch_workflow("missing.yml", "pr-5", {})


def test_a_dispatch_is_never_sent_twice(github_double, adapter):
    github_double.state.add_workflow("speed.yml")
    github_double.state.add_pull(5)
    github_double.state.inject("workflows.dispatch", Fault.server_error(500))
    with pytest.raises(GitHubUnavailable, match="may have been applied"):
        adapter.dispatch_workflow("speed.yml", "pr-5", {})
    assert len(github_double.state.calls("workflows.dispatch")) == 1


def test_an_artifact_that_escapes_its_folder_is_rejected(github_double, adapter, tmp_path):
    s = github_double.state
    s.add_workflow("speed.yml")
    s.add_pull(5)
    run = s.start_run("speed.yml", "pr-5", {})
    bad = s.add_artifact(
        run.id, "measurements", zip_bytes({"result.json": "{}", "../../escaped.txt": "pwned"})
    )
    with pytest.raises(
        ArtifactRejected, match=r"'../../escaped.txt' would be written outside the artifact folder"
    ):
        adapter.download_artifact(bad.id, tmp_path / "dl")
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path.parent / "escaped.txt").exists()
    assert not (tmp_path / "dl").exists() or list((tmp_path / "dl").iterdir()) == []


def test_an_expired_artifact_is_a_clear_refusal(github_double, adapter, tmp_path):
    s = github_double.state
    s.add_workflow("speed.yml")
    s.add_pull(5)
    (artifact,) = s.complete_run(s.start_run("speed.yml", "pr-5", {}).id, artifacts={"m": {"a": "b"}})
    artifact.expired = True
    with pytest.raises(
        GitHubError, match=rf"actions/artifacts/{artifact.id}/zip: HTTP 410: Artifact has expired"
    ):
        adapter.download_artifact(artifact.id, tmp_path)


# --- construction ---


def test_a_repo_that_is_not_owner_slash_name_is_refused():
    with pytest.raises(ValueError, match="repo must be 'owner/name', got 'engine'"):
        PyGithubAdapter.from_token("engine", TOKEN)


def test_the_adapter_implements_every_operation_of_the_port():
    import inspect

    from evalbot.github import GitHubPort

    operations = [
        name for name, _ in inspect.getmembers(GitHubPort, inspect.isfunction) if not name.startswith("_")
    ]
    assert len(operations) == 18
    for name in operations:
        port, impl = (
            inspect.signature(getattr(GitHubPort, name)),
            inspect.signature(getattr(PyGithubAdapter, name)),
        )
        assert list(impl.parameters)[: len(port.parameters)] == list(port.parameters), name
        assert impl.return_annotation == port.return_annotation, name


def test_run_jobs_name_the_runner_and_a_run_can_be_cancelled(github_double, adapter):
    s = github_double.state
    s.add_workflow("evalbot-eval.yml")
    s.refs["main"] = "a" * 40
    adapter.dispatch_workflow("evalbot-eval.yml", "main", {"pr": "1"})
    (run_id,) = s.runs
    s.pick_up_run(run_id, "gpu-box-3")
    assert [j["runner_name"] for j in adapter.list_run_jobs(run_id)] == ["gpu-box-3"]
    adapter.cancel_workflow_run(run_id)
    assert (s.runs[run_id].status, s.runs[run_id].conclusion) == ("completed", "cancelled")
    with pytest.raises(GitHubError):
        adapter.cancel_workflow_run(run_id)  # already completed: GitHub answers 409


def test_the_token_s_login_is_known_and_an_app_token_has_none(github_double, adapter):
    assert adapter.authenticated_login() == github_double.state.bot
    github_double.state.inject("user.get", Fault.server_error(403))
    assert adapter.authenticated_login() is None  # what an Actions job token answers


def test_an_outage_does_not_pass_for_a_token_without_a_user(github_double, adapter, fake_clock):
    github_double.state.inject("user.get", *[Fault.server_error(502)] * 10)
    with pytest.raises(GitHubError):  # retried, then raised: the bot must not guess another login
        adapter.authenticated_login()
