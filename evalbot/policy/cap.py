"""Open-PR cap: each author's oldest ``policy.open_pr_cap`` open PRs are evaluated, newer ones wait.

Drafts take no slot (they are not evaluated either). Age is the PR's creation time, ties broken by the
lower number, so the order never changes while the PRs stay open.
"""

from __future__ import annotations

from collections.abc import Iterable

from evalbot.model import Prose, PullRequest
from evalbot.policy.decision import PolicyDecision, parse_time, stop
from evalbot.rules import Rules


def queue_position(pr: PullRequest, open_prs: Iterable[PullRequest]) -> int:
    """1-based position of the PR among its author's open, non-draft PRs, oldest first."""
    mine = {p.number: p for p in open_prs if p.author.casefold() == pr.author.casefold()}
    mine[pr.number] = pr
    ordered = sorted(
        (p for p in mine.values() if p.state == "open" and not p.draft),
        key=lambda p: (parse_time(p.created_at, f"PR {p.number} created_at"), p.number),
    )
    numbers = [p.number for p in ordered]
    return numbers.index(pr.number) + 1 if pr.number in numbers else len(numbers) + 1


def check(pr: PullRequest, rules: Rules, open_prs: Iterable[PullRequest]) -> PolicyDecision | None:
    """SKIP a PR beyond its author's cap of open PRs; None within it."""
    cap = rules.policy.open_pr_cap
    position = queue_position(pr, open_prs)
    if position <= cap:
        return None
    comment = Prose.of("cap", cap=cap, position=position)
    reason = f"over the open-PR cap: number {position} of the author's open PRs, cap {cap}"
    return stop("cap", reason, rules.labels.skipped_cap, comment)
