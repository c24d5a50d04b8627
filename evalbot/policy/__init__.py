"""Intake policy: which PRs the bot evaluates, and the labels and comments that say why. Pure.

``intake`` applies the rules in a fixed order, one module each:

1. drafts          a draft (or a PR no longer open) is ignored: no labels, no comment;
2. blocklist       anyone behind the PR (opener, authors, co-authors, committers) blocked: flagged and
                   closed, never evaluated;
3. complete        GitHub listed the PR's commits or files only in part: skipped, asked to squash;
4. sensitive_paths the PR could change the judge: skipped (maintainers exempt);
5. cap             beyond the author's open-PR cap: skipped until an older one closes;
6. stale           exhausted (too many fruitless verdicts) or stale (no recent push): skipped;
7. template        no ticked Tested box and gaining before/after table: needs-benchmark;
8. areas           area labels from the paths.

The first rule that stops evaluation ends the chain, so a PR gets one reason, the most fundamental.
Areas are labelled on every PR that is neither ignored nor closed. The decision carries the full label
change as set differences against the PR's current labels, over the labels intake owns (skipped:*,
needs-benchmark, stale, exhausted and the areas): a label whose cause went away is removed, and a
PR whose state did not change yields no label change at all. The gaming label is only ever added here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from evalbot.model import Decision, Notice, Prose, PullRequest, Verdict
from evalbot.policy import areas, blocklist, cap, complete, drafts, sensitive_paths, stale, template
from evalbot.policy.decision import Action, PolicyDecision, is_maintainer
from evalbot.policy.template import ClaimGap, TemplateFacts, claim_gap, parse_body
from evalbot.rules import LabelFamily, Rules

__all__ = [
    "Action",
    "ClaimGap",
    "IntakeContext",
    "IntakeDecision",
    "PolicyDecision",
    "TemplateFacts",
    "claim_gap",
    "intake",
    "is_maintainer",
    "parse_body",
]


@dataclass(frozen=True)
class IntakeContext:
    """Facts beyond the PR itself that intake needs, gathered by the caller (store and GitHub)."""

    now: datetime
    blocked: frozenset[str] = frozenset()  # the store's blocklist; the rules' own list is added to it
    open_prs: tuple[PullRequest, ...] = ()  # the repository's open PRs, for the per-author cap
    verdicts: tuple[Verdict, ...] = ()  # this PR's verdicts since a maintainer last cleared it
    last_push_at: str | None = None  # ISO 8601; None falls back to the PR's creation


@dataclass(frozen=True)
class IntakeDecision:
    """Whether to evaluate, whether to close, the label changes, the comment, and each rule's decision."""

    evaluate: bool
    close: bool
    labels_add: tuple[str, ...]
    labels_remove: tuple[str, ...]
    comment: tuple[Prose, ...]  # each fired rule's words for the PR, in order
    decisions: tuple[PolicyDecision, ...]  # the rules that fired, in order
    areas: tuple[str, ...]
    claim: TemplateFacts

    @property
    def stopped_by(self) -> str | None:
        """The rule that stopped evaluation, or None."""
        return next((d.rule for d in self.decisions if not d.evaluate), None)

    @property
    def reasons(self) -> tuple[str, ...]:
        """Each fired rule's plain-text reason, in order."""
        return tuple(d.reason for d in self.decisions)

    def as_decision(self, rules: Rules) -> Decision:
        """In the one shape the publisher applies: intake's labels, and for a PR it stops, the notice,
        the close and the flag."""
        owned = tuple(sorted({*self.labels_remove, *self.labels_add}))
        stopped = self.stopped_by or "policy"
        if self.close:
            return Decision(self.labels_add, owned, False, Notice("close", "closed unevaluated", self.reasons,
                                                                  self.comment),
                            close=stopped, flag=rules.labels.gaming, note=f"closed by {stopped}")  # fmt: skip
        if not self.evaluate:
            return Decision(self.labels_add, owned, False,
                            Notice("skip", f"not evaluated ({stopped})", self.reasons, self.comment),
                            note=f"not evaluated ({stopped})")  # fmt: skip
        return Decision(self.labels_add, owned)


def intake(pr: PullRequest, rules: Rules, context: IntakeContext) -> IntakeDecision:
    """Decide what to do with one PR on intake (see the module docstring for the order)."""
    claim = template.parse_body(pr.body)  # once: every rule and the report use these facts
    draft = drafts.check(pr, rules)
    if draft is not None:
        return IntakeDecision(False, False, (), (), (), (draft,), (), claim)

    chain = (
        lambda: blocklist.check(pr, rules, context.blocked),
        lambda: complete.check(pr, rules),
        lambda: sensitive_paths.check(pr, rules),
        lambda: cap.check(pr, rules, context.open_prs),
        lambda: stale.check(pr, rules, context.verdicts, context.now, context.last_push_at),
        lambda: template.check(pr, rules, claim),
    )
    fired: list[PolicyDecision] = []
    for rule in chain:
        decision = rule()
        if decision is None:
            continue
        fired.append(decision)
        if not decision.evaluate:
            break
    close = any(d.close for d in fired)
    touched: tuple[str, ...] = ()
    if not close:
        area = areas.check(pr, rules)
        fired.append(area)
        touched = area.labels_add

    wanted = {label for d in fired for label in d.labels_add}
    current = set(pr.labels)
    add = tuple(sorted(wanted - current))
    remove = tuple(sorted((rules.owned(LabelFamily.INTAKE) - wanted) & current))
    comments = tuple(d.comment for d in fired if d.comment)
    return IntakeDecision(
        evaluate=all(d.evaluate for d in fired),
        close=close,
        labels_add=add,
        labels_remove=remove,
        comment=comments,
        decisions=tuple(fired),
        areas=touched,
        claim=claim,
    )
