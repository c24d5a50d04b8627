"""Complete facts: a PR GitHub lists only in part is never evaluated.

GitHub lists at most 250 commits and 3000 files of a PR, and can omit a huge file's patch. The blocklist,
the copycat screen and the sensitive-path check would then vouch for commits and files nobody saw, so the
PR waits, with a note asking the contributor to squash it.
"""

from __future__ import annotations

from evalbot.model import Prose, PullRequest
from evalbot.policy.decision import Action, PolicyDecision
from evalbot.rules import Rules


def check(pr: PullRequest, rules: Rules) -> PolicyDecision | None:
    """SKIP a PR whose facts GitHub listed only in part; None when they are complete."""
    if not pr.incomplete:
        return None
    why = "; ".join(pr.incomplete[:3])
    return PolicyDecision(
        "complete", Action.SKIP, False, f"incomplete facts: {why}", comment=Prose.of("complete", why=why)
    )
