"""Drafts: not evaluated, labelled or commented on until marked ready for review. Nor are closed PRs."""

from __future__ import annotations

from evalbot.model import PullRequest
from evalbot.policy.decision import Action, PolicyDecision
from evalbot.rules import Rules


def check(pr: PullRequest, rules: Rules) -> PolicyDecision | None:
    """IGNORE a draft, or a PR that is no longer open; None for an open PR ready for review."""
    if pr.state != "open":
        return PolicyDecision("drafts", Action.IGNORE, False, f"not open ({pr.state}): ignored")
    if pr.draft:
        return PolicyDecision(
            "drafts", Action.IGNORE, False, "draft: ignored until it is marked ready for review"
        )
    return None
