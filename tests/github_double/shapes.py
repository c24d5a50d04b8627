"""JSON bodies in the shapes real GitHub returns (REST API, 2022-11-28), built from the double's state.

Only the structure matters here, not every URL being resolvable: the contract test checks these shapes
against recorded api.github.com traffic.
"""

from __future__ import annotations

import base64
import zlib
from typing import Any

from tests.github_double.state import (
    ArtifactState,
    CommentState,
    CommitState,
    FileState,
    GitHubState,
    PullState,
    RunState,
    StatusState,
    fake_sha,
)

DOCS = "https://docs.github.com/rest"


def _id(*parts: object) -> int:
    return zlib.crc32(" ".join(map(str, parts)).encode()) + 1


def _node(kind: str, ident: int) -> str:
    return base64.b64encode(f"{kind}{ident}".encode()).decode()


def error(message: str, status: int) -> dict[str, Any]:
    """GitHub's error body."""
    return {"message": message, "documentation_url": DOCS, "status": str(status)}


def user(s: GitHubState, login: str) -> dict[str, Any]:
    """A user (or bot) as embedded in other objects."""
    ident = _id("user", login)
    api = f"{s.base_url}/users/{login}"
    return {
        "login": login,
        "id": ident,
        "node_id": _node("U_", ident),
        "avatar_url": f"https://avatars.example.invalid/u/{ident}",
        "gravatar_id": "",
        "url": api,
        "html_url": f"https://github.com/{login}",
        "followers_url": f"{api}/followers",
        "following_url": f"{api}/following{{/other_user}}",
        "gists_url": f"{api}/gists{{/gist_id}}",
        "starred_url": f"{api}/starred{{/owner}}{{/repo}}",
        "subscriptions_url": f"{api}/subscriptions",
        "organizations_url": f"{api}/orgs",
        "repos_url": f"{api}/repos",
        "events_url": f"{api}/events{{/privacy}}",
        "received_events_url": f"{api}/received_events",
        "type": "Bot" if login.endswith("[bot]") else "User",
        "user_view_type": "public",
        "site_admin": False,
    }


def authenticated_user(s: GitHubState) -> dict[str, Any]:
    """GET /user: the account the token belongs to, with its profile."""
    return user(s, s.bot) | {
        "name": s.bot,
        "company": None,
        "blog": "",
        "location": None,
        "email": None,
        "hireable": None,
        "bio": None,
        "public_repos": 0,
        "public_gists": 0,
        "followers": 0,
        "following": 0,
        "created_at": s.iso(0),
        "updated_at": s.iso(0),
        "private_gists": 0,
        "total_private_repos": 0,
        "owned_private_repos": 0,
        "disk_usage": 0,
        "collaborators": 0,
        "plan": {"name": "free", "space": 976562499, "collaborators": 0, "private_repos": 10000},
    }


def _reactions(url: str) -> dict[str, Any]:
    counts = dict.fromkeys(["+1", "-1", "laugh", "hooray", "confused", "heart", "rocket", "eyes"], 0)
    return {"url": url, "total_count": 0, **counts}


def repo(s: GitHubState) -> dict[str, Any]:
    """The repository."""
    ident = _id("repo", s.owner, s.name)
    api = f"{s.base_url}/repos/{s.owner}/{s.name}"
    return {
        "id": ident,
        "node_id": _node("R_", ident),
        "name": s.name,
        "full_name": f"{s.owner}/{s.name}",
        "private": False,
        "owner": user(s, s.owner),
        "html_url": f"https://github.com/{s.owner}/{s.name}",
        "description": "The engine of the speed contest",
        "fork": False,
        "url": api,
        "pulls_url": f"{api}/pulls{{/number}}",
        "issues_url": f"{api}/issues{{/number}}",
        "statuses_url": f"{api}/statuses/{{sha}}",
        "clone_url": s.clone_url or f"https://github.com/{s.owner}/{s.name}.git",
        "default_branch": "main",
        "visibility": "public",
        "archived": False,
        "disabled": False,
        "created_at": s.iso(0),
        "updated_at": s.iso(),
        "pushed_at": s.iso(),
        "permissions": {"admin": False, "maintain": False, "push": True, "triage": True, "pull": True},
    }


def label(s: GitHubState, name: str) -> dict[str, Any]:
    """A label; GitHub creates unknown labels on first use."""
    ident = _id("label", name)
    return {
        "id": ident,
        "node_id": _node("LA_", ident),
        "url": f"{s.base_url}/repos/{s.owner}/{s.name}/labels/{name}",
        "name": name,
        "color": f"{ident % 0xFFFFFF:06x}",
        "default": False,
        "description": None,
    }


def _branch(s: GitHubState, ref: str, sha: str) -> dict[str, Any]:
    return {"label": f"{s.owner}:{ref}", "ref": ref, "sha": sha, "user": user(s, s.owner), "repo": repo(s)}


def pull(s: GitHubState, p: PullState, *, full: bool) -> dict[str, Any]:
    """A PR: the list's shape, or with ``full`` the single GET's (mergeability and counts)."""
    api = f"{s.base_url}/repos/{s.owner}/{s.name}"
    ident = _id("pull", p.number)
    html = f"https://github.com/{s.owner}/{s.name}/pull/{p.number}"
    body: dict[str, Any] = {
        "url": f"{api}/pulls/{p.number}",
        "id": ident,
        "node_id": _node("PR_", ident),
        "html_url": html,
        "diff_url": f"{html}.diff",
        "patch_url": f"{html}.patch",
        "issue_url": f"{api}/issues/{p.number}",
        "number": p.number,
        "state": p.state,
        "locked": False,
        "title": p.title,
        "user": user(s, p.author),
        "body": p.body,
        "created_at": p.created_at,
        "updated_at": p.updated_at,
        "closed_at": p.closed_at,
        "merged_at": p.merged_at,
        "merge_commit_sha": p.merge_commit_sha,
        "assignee": None,
        "assignees": [],
        "requested_reviewers": [],
        "requested_teams": [],
        "labels": [label(s, name) for name in p.labels],
        "milestone": None,
        "draft": p.draft,
        "commits_url": f"{api}/pulls/{p.number}/commits",
        "review_comments_url": f"{api}/pulls/{p.number}/comments",
        "review_comment_url": f"{api}/pulls/comments{{/number}}",
        "comments_url": f"{api}/issues/{p.number}/comments",
        "statuses_url": f"{api}/statuses/{p.head_sha}",
        "head": _branch(s, p.head_ref, p.head_sha),
        "base": _branch(s, p.base_ref, p.base_sha),
        "_links": {
            "self": {"href": f"{api}/pulls/{p.number}"},
            "html": {"href": html},
            "issue": {"href": f"{api}/issues/{p.number}"},
            "comments": {"href": f"{api}/issues/{p.number}/comments"},
            "review_comments": {"href": f"{api}/pulls/{p.number}/comments"},
            "review_comment": {"href": f"{api}/pulls/comments{{/number}}"},
            "commits": {"href": f"{api}/pulls/{p.number}/commits"},
            "statuses": {"href": f"{api}/statuses/{p.head_sha}"},
        },
        "author_association": p.author_association,
        "auto_merge": None,
        "active_lock_reason": None,
    }
    if full:
        computing = p.mergeable_null_polls > 0
        body |= {
            "merged": p.merged,
            "mergeable": None if computing else p.mergeable,
            "rebaseable": None if computing else p.mergeable,
            "mergeable_state": "unknown" if computing else p.mergeable_state,
            "merged_by": user(s, p.merged_by) if p.merged_by else None,
            "comments": sum(c.issue == p.number for c in s.comments.values()),
            "review_comments": 0,
            "maintainer_can_modify": False,
            "commits": len(p.commits),
            "additions": sum(f.additions for f in p.files),
            "deletions": sum(f.deletions for f in p.files),
            "changed_files": len(p.files),
        }
    return body


def issue(s: GitHubState, p: PullState) -> dict[str, Any]:
    """The issue side of a PR, as PATCH /issues/{n} returns it."""
    api = f"{s.base_url}/repos/{s.owner}/{s.name}"
    ident = _id("issue", p.number)
    return {
        "url": f"{api}/issues/{p.number}",
        "repository_url": api,
        "labels_url": f"{api}/issues/{p.number}/labels{{/name}}",
        "comments_url": f"{api}/issues/{p.number}/comments",
        "events_url": f"{api}/issues/{p.number}/events",
        "html_url": f"https://github.com/{s.owner}/{s.name}/pull/{p.number}",
        "id": ident,
        "node_id": _node("I_", ident),
        "number": p.number,
        "title": p.title,
        "user": user(s, p.author),
        "labels": [label(s, name) for name in p.labels],
        "state": p.state,
        "locked": False,
        "assignee": None,
        "assignees": [],
        "milestone": None,
        "comments": sum(c.issue == p.number for c in s.comments.values()),
        "created_at": p.created_at,
        "updated_at": p.updated_at,
        "closed_at": p.closed_at,
        "author_association": p.author_association,
        "body": p.body,
        "state_reason": None if p.state == "open" else "completed",
        "active_lock_reason": None,
        "closed_by": user(s, s.bot) if p.state == "closed" else None,
        "performed_via_github_app": None,
        "timeline_url": f"{api}/issues/{p.number}/timeline",
        "reactions": _reactions(f"{api}/issues/{p.number}/reactions"),
        "pull_request": {
            "url": f"{api}/pulls/{p.number}",
            "html_url": f"https://github.com/{s.owner}/{s.name}/pull/{p.number}",
            "merged_at": p.merged_at,
        },
    }


def pull_file(s: GitHubState, p: PullState, f: FileState) -> dict[str, Any]:
    """One entry of pulls/{n}/files; ``patch`` is left out as GitHub does for binary and huge files."""
    blob = fake_sha("blob", p.head_sha, f.filename)
    raw = f"https://github.com/{s.owner}/{s.name}/raw/{p.head_sha}/{f.filename}"
    body: dict[str, Any] = {
        "sha": blob,
        "filename": f.filename,
        "status": f.status,
        "additions": f.additions,
        "deletions": f.deletions,
        "changes": f.additions + f.deletions,
        "blob_url": f"https://github.com/{s.owner}/{s.name}/blob/{p.head_sha}/{f.filename}",
        "raw_url": raw,
        "contents_url": f"{s.base_url}/repos/{s.owner}/{s.name}/contents/{f.filename}?ref={p.head_sha}",
    }
    if f.patch is not None:
        body["patch"] = f.patch
    if f.previous_filename is not None:
        body["previous_filename"] = f.previous_filename
    return body


def _signature(name: str, email: str, date: str) -> dict[str, str]:
    return {"name": name, "email": email, "date": date}


def commit(s: GitHubState, c: CommitState) -> dict[str, Any]:
    """One entry of pulls/{n}/commits; author/committer are null when no account has the email."""
    api = f"{s.base_url}/repos/{s.owner}/{s.name}"
    author, committer = s.users_by_email.get(c.author_email), s.users_by_email.get(c.committer_email)
    tree = fake_sha("tree", c.sha)
    return {
        "sha": c.sha,
        "node_id": _node("C_", _id("commit", c.sha)),
        "commit": {
            "author": _signature(c.author_name, c.author_email, c.author_date),
            "committer": _signature(c.committer_name, c.committer_email, c.committer_date),
            "message": c.message,
            "tree": {"sha": tree, "url": f"{api}/git/trees/{tree}"},
            "url": f"{api}/git/commits/{c.sha}",
            "comment_count": 0,
            "verification": {"verified": False, "reason": "unsigned", "signature": None, "payload": None},
        },
        "url": f"{api}/commits/{c.sha}",
        "html_url": f"https://github.com/{s.owner}/{s.name}/commit/{c.sha}",
        "comments_url": f"{api}/commits/{c.sha}/comments",
        "author": user(s, author) if author else None,
        "committer": user(s, committer) if committer else None,
        "parents": [{"sha": sha, "url": f"{api}/commits/{sha}", "html_url": ""} for sha in c.parents],
    }


def comment(s: GitHubState, c: CommentState) -> dict[str, Any]:
    """An issue comment."""
    api = f"{s.base_url}/repos/{s.owner}/{s.name}"
    return {
        "url": f"{api}/issues/comments/{c.id}",
        "html_url": f"https://github.com/{s.owner}/{s.name}/pull/{c.issue}#issuecomment-{c.id}",
        "issue_url": f"{api}/issues/{c.issue}",
        "id": c.id,
        "node_id": _node("IC_", c.id),
        "user": user(s, c.author),
        "created_at": c.created_at,
        "updated_at": c.updated_at,
        "author_association": "NONE",
        "body": c.body,
        "performed_via_github_app": None,
    }


def status(s: GitHubState, st: StatusState) -> dict[str, Any]:
    """A commit status."""
    return {
        "url": f"{s.base_url}/repos/{s.owner}/{s.name}/statuses/{st.sha}",
        "avatar_url": None,
        "id": st.id,
        "node_id": _node("SC_", st.id),
        "state": st.state,
        "description": st.description,
        "target_url": st.target_url,
        "context": st.context,
        "created_at": st.created_at,
        "updated_at": st.created_at,
        "creator": user(s, st.creator),
    }


def run(s: GitHubState, r: RunState) -> dict[str, Any]:
    """A workflow run."""
    api = f"{s.base_url}/repos/{s.owner}/{s.name}"
    title = r.display_title or str(r.inputs.get("title") or f"{r.workflow_file} on {r.head_branch}")
    return {
        "id": r.id,
        "name": r.workflow_file.rsplit(".", 1)[0],
        "node_id": _node("WFR_", r.id),
        "head_branch": r.head_branch,
        "head_sha": r.head_sha,
        "path": f".github/workflows/{r.workflow_file}",
        "display_title": title,
        "run_number": r.run_number,
        "event": r.event,
        "status": r.status,
        "conclusion": r.conclusion,
        "workflow_id": r.workflow_id,
        "check_suite_id": _id("suite", r.id),
        "check_suite_node_id": _node("CS_", r.id),
        "url": f"{api}/actions/runs/{r.id}",
        "html_url": f"https://github.com/{s.owner}/{s.name}/actions/runs/{r.id}",
        "pull_requests": [],
        "created_at": r.created_at,
        "updated_at": r.updated_at,
        "actor": user(s, r.actor),
        "run_attempt": 1,
        "referenced_workflows": [],
        "run_started_at": r.created_at,
        "triggering_actor": user(s, r.actor),
        "jobs_url": f"{api}/actions/runs/{r.id}/jobs",
        "logs_url": f"{api}/actions/runs/{r.id}/logs",
        "check_suite_url": f"{api}/check-suites/{_id('suite', r.id)}",
        "artifacts_url": f"{api}/actions/runs/{r.id}/artifacts",
        "cancel_url": f"{api}/actions/runs/{r.id}/cancel",
        "rerun_url": f"{api}/actions/runs/{r.id}/rerun",
        "previous_attempt_url": None,
        "workflow_url": f"{api}/actions/workflows/{r.workflow_id}",
        "head_commit": {
            "id": r.head_sha,
            "tree_id": fake_sha("tree", r.head_sha),
            "message": "",
            "timestamp": r.created_at,
        },
        "repository": repo(s),
        "head_repository": repo(s),
    }


def job(s: GitHubState, r: RunState) -> dict[str, Any]:
    """The one job of a run (runner fields null until a runner picks it up)."""
    api = f"{s.base_url}/repos/{s.owner}/{s.name}"
    ident = _id("job", r.id)
    picked = r.runner_name is not None
    return {
        "id": ident,
        "run_id": r.id,
        "workflow_name": r.workflow_file.rsplit(".", 1)[0],
        "head_branch": r.head_branch,
        "run_url": f"{api}/actions/runs/{r.id}",
        "run_attempt": 1,
        "node_id": _node("CR_", ident),
        "head_sha": r.head_sha,
        "url": f"{api}/actions/jobs/{ident}",
        "html_url": f"https://github.com/{s.owner}/{s.name}/actions/runs/{r.id}/job/{ident}",
        "status": r.status,
        "conclusion": r.conclusion,
        "created_at": r.created_at,
        "started_at": r.created_at,
        "completed_at": r.updated_at if r.status == "completed" else None,
        "name": "evaluate",
        "steps": [],
        "check_run_url": f"{api}/check-runs/{ident}",
        "labels": ["self-hosted"],
        "runner_id": _id("runner", r.runner_name) if picked else None,
        "runner_name": r.runner_name,
        "runner_group_id": 1 if picked else None,
        "runner_group_name": "Default" if picked else None,
    }


def artifact(s: GitHubState, a: ArtifactState) -> dict[str, Any]:
    """An artifact of a run."""
    api = f"{s.base_url}/repos/{s.owner}/{s.name}"
    r = s.runs[a.run_id]
    return {
        "id": a.id,
        "node_id": _node("MDg6QXJ0aWZhY3Q", a.id),
        "name": a.name,
        "size_in_bytes": len(a.data),
        "url": f"{api}/actions/artifacts/{a.id}",
        "archive_download_url": f"{api}/actions/artifacts/{a.id}/zip",
        "expired": a.expired,
        "digest": None,
        "created_at": a.created_at,
        "updated_at": a.created_at,
        "expires_at": s.iso(s.now + 90 * 86400),
        "workflow_run": {
            "id": r.id,
            "repository_id": _id("repo", s.owner, s.name),
            "head_repository_id": _id("repo", s.owner, s.name),
            "head_branch": r.head_branch,
            "head_sha": r.head_sha,
        },
    }


def rate_limit(s: GitHubState, reset: int) -> dict[str, Any]:
    """GET /rate_limit."""
    core = {
        "limit": s.rate_limit,
        "used": s.rate_limit - s.rate_remaining,
        "remaining": s.rate_remaining,
        "reset": reset,
    }
    other = {"limit": 5000, "used": 0, "remaining": 5000, "reset": reset}
    return {
        "resources": {"core": core, "graphql": other, "search": other | {"limit": 30, "remaining": 30}},
        "rate": core,
    }
