"""What one intake rule decides about a PR, and small facts the rules share (maintainers, timestamps)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from evalbot import times
from evalbot.model import Prose, PullRequest

# GitHub's author_association values of people with write access: they run the contest.
MAINTAINER_ASSOCIATIONS = frozenset({"OWNER", "MEMBER", "COLLABORATOR"})


class Action(enum.StrEnum):
    """What intake does with a PR because of one rule."""

    IGNORE = "ignore"  # not looked at now, no labels, no comment (drafts, closed PRs)
    CLOSE_FLAG = "close_flag"  # flagged and closed, never evaluated
    SKIP = "skip"  # labelled and commented, not evaluated until the cause goes away
    NEEDS_BENCHMARK = "needs_benchmark"  # waits for the contributor's own numbers
    LABEL = "label"  # labels only; evaluation goes ahead


@dataclass(frozen=True)
class PolicyDecision:
    """One rule's decision: whether evaluation proceeds, labels to add, a reason and the words for the PR.

    ``reason`` is plain text for logs and reports; ``comment`` names the rule's template and its data (the
    template escapes every contributor-controlled string: paths, logins).
    """

    rule: str
    action: Action
    evaluate: bool
    reason: str
    labels_add: tuple[str, ...] = ()
    comment: Prose | None = None
    close: bool = False


def stop(rule: str, reason: str, label: str, comment: Prose, *, close: bool = False) -> PolicyDecision:
    """A rule that stops evaluation: SKIP (labelled, commented, not evaluated until the cause goes away),
    or with close, CLOSE_FLAG (flagged and closed, never evaluated)."""
    action = Action.CLOSE_FLAG if close else Action.SKIP
    return PolicyDecision(rule, action, False, reason, labels_add=(label,), comment=comment, close=close)


def is_maintainer(pr: PullRequest) -> bool:
    """Whether the PR's opener has write access (OWNER, MEMBER or COLLABORATOR on GitHub)."""
    return pr.author_association.upper() in MAINTAINER_ASSOCIATIONS


def parse_time(text: str, what: str) -> datetime:
    """An ISO 8601 timestamp as an aware UTC datetime; ValueError naming the field otherwise."""
    try:
        return times.parse(text)
    except (TypeError, ValueError):
        raise ValueError(
            f"{what}: expected an ISO 8601 UTC timestamp such as 2026-11-30T10:00:00Z, got {text!r}"
        ) from None
