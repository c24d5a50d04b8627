"""Stale and exhausted PRs stop being evaluated.

Exhausted: more than ``policy.stale.max_fruitless_verdicts`` verdicts that earned nothing (REJECT, or a
PASS below the first tier). Each costs a box for the length of a measurement, so a PR cannot keep trying
its luck; a maintainer's ``clear`` starts the count again (the caller passes only the verdicts since the
last clear). INFRA_ERROR and SKIPPED never count: they are not the contributor's doing.

Stale: no push for more than ``policy.stale.days_without_push`` days. A push makes it fresh again.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from evalbot.model import Prose, PullRequest, Status, Verdict
from evalbot.policy.decision import PolicyDecision, parse_time, stop
from evalbot.rules import Rules


def fruitless(verdicts: Iterable[Verdict]) -> int:
    """How many verdicts earned nothing: REJECTs and PASSes without a tier."""
    return sum(
        1 for v in verdicts if v.status == Status.REJECT or (v.status == Status.PASS and v.tier is None)
    )


def check(
    pr: PullRequest,
    rules: Rules,
    verdicts: Iterable[Verdict],
    now: datetime,
    last_push_at: str | None = None,
) -> PolicyDecision | None:
    """SKIP an exhausted or stale PR; None otherwise. ``last_push_at`` defaults to the PR's creation."""
    limits = rules.policy.stale
    count = fruitless(verdicts)
    if count > limits.max_fruitless_verdicts:
        return stop(
            "stale",
            f"exhausted: {count} evaluations without a tier (limit {limits.max_fruitless_verdicts})",
            rules.labels.exhausted,
            Prose.of("exhausted", count=count, limit=limits.max_fruitless_verdicts),
        )
    pushed = parse_time(last_push_at or pr.created_at, "last push" if last_push_at else "created_at")
    idle = now - pushed
    if idle > timedelta(days=limits.days_without_push):
        return stop(
            "stale",
            f"stale: no push for {idle.days} days (limit {limits.days_without_push})",
            rules.labels.stale,
            Prose.of("stale", days=idle.days),
        )
    return None
