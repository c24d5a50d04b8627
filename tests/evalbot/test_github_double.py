"""The GitHub double itself: pagination, conditional GETs, rate-limit headers, and real git merges."""

from __future__ import annotations

import requests

from tests.github_double.gitrepo import BareRepo, add_git_pull
from tests.github_double.state import FileState

pytest_plugins = ["tests.github_double.fixture"]  # github_double

R = "/repos/contest/engine"


def get(double, path, **headers):
    return requests.get(double.base_url + path, headers=headers, timeout=5)


def test_lists_paginate_with_githubs_link_header(github_double):
    github_double.state.add_pull(1, files=[FileState(f"f{i}", "added", 1, 0, "+x") for i in range(5)])
    first = get(github_double, f"{R}/pulls/1/files?per_page=2")
    assert [f["filename"] for f in first.json()] == ["f0", "f1"]
    links = requests.utils.parse_header_links(first.headers["Link"])
    assert {link["rel"]: link["url"] for link in links} == {
        "next": f"{github_double.base_url}{R}/pulls/1/files?per_page=2&page=2",
        "last": f"{github_double.base_url}{R}/pulls/1/files?per_page=2&page=3",
    }
    last = get(github_double, f"{R}/pulls/1/files?per_page=2&page=3")
    assert [f["filename"] for f in last.json()] == ["f4"]
    assert 'rel="next"' not in last.headers["Link"] and 'rel="prev"' in last.headers["Link"]
    assert (
        get(github_double, f"{R}/pulls/1/files?per_page=500").json().__len__() == 5
    )  # capped at 100, not refused


def test_conditional_gets_answer_304_without_spending_the_rate_limit(github_double):
    github_double.state.add_pull(1)
    first = get(github_double, f"{R}/pulls/1")
    remaining = int(first.headers["X-RateLimit-Remaining"])
    again = get(github_double, f"{R}/pulls/1", **{"If-None-Match": first.headers["ETag"]})
    assert (again.status_code, again.content, again.headers["ETag"]) == (304, b"", first.headers["ETag"])
    assert int(again.headers["X-RateLimit-Remaining"]) == remaining
    github_double.state.set_mergeable(1, False)
    changed = get(github_double, f"{R}/pulls/1", **{"If-None-Match": first.headers["ETag"]})
    assert changed.status_code == 200 and changed.json()["mergeable_state"] == "dirty"
    assert int(changed.headers["X-RateLimit-Remaining"]) == remaining - 1


def test_unknown_routes_and_other_repositories_are_404_and_recorded(github_double):
    assert get(github_double, "/repos/someone/else/pulls").status_code == 404
    assert get(github_double, f"{R}/no/such/thing").json()["message"] == "Not Found"
    assert [r.route for r in github_double.state.requests] == ["pulls.list", "unknown"]


def test_a_merge_commit_has_both_parents_and_a_conflict_is_not_mergeable(github_double, tmp_path):
    s = github_double.state
    repo = BareRepo.create(tmp_path / "e.git", {"a.py": "a = 1\n", "b.py": "b = 1\n"}, s.now)
    first = add_git_pull(s, repo, 1, {"a.py": "a = 2\n"})
    second = add_git_pull(s, repo, 2, {"a.py": "a = 3\n"})
    old_main = repo.rev("main")
    answer = requests.put(
        f"{github_double.base_url}{R}/pulls/1/merge", json={"merge_method": "merge"}, timeout=5
    ).json()
    assert repo.git("rev-list", "--parents", "-n1", answer["sha"]).split() == [
        answer["sha"],
        old_main,
        first.head_sha,
    ]
    refused = requests.put(
        f"{github_double.base_url}{R}/pulls/2/merge", json={"sha": second.head_sha}, timeout=5
    )
    assert (
        refused.status_code == 405
        and refused.json()["message"] == "Pull Request is not mergeable: merge conflict in a.py"
    )
    assert repo.rev("main") == answer["sha"] and not s.pulls[2].merged


def test_git_backed_prs_can_be_fetched_from_the_file_url(github_double, tmp_path):
    import subprocess

    s = github_double.state
    repo = BareRepo.create(tmp_path / "e.git", {"a.py": "a = 1\n"}, s.now)
    pull = add_git_pull(s, repo, 4, {"a.py": "a = 4\n"})
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", get(github_double, R).json()["clone_url"], str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "fetch", "-q", "origin", pull.head_sha], check=True)
    shown = subprocess.run(
        ["git", "-C", str(clone), "show", f"{pull.head_sha}:a.py"], check=True, capture_output=True
    )
    assert shown.stdout == b"a = 4\n"
