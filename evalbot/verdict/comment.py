"""What publishing a measured verdict means: the PR's one bot comment (the numbers, then where the PR
stands), its verdict and claim labels, and its commit status, as one Decision for the publisher.

The prose is the templates' (`comment.md.j2` and `_standing.md.j2`); this module only chooses.
"""

from __future__ import annotations

from collections.abc import Iterable

from evalbot import receipts, render, rounds
from evalbot.model import DECODE_METRICS, Decision, PullRequest, Status, Verdict
from evalbot.policy import ClaimGap, TemplateFacts, claim_gap
from evalbot.rules import LabelFamily, Rules
from evalbot.store import EvaluationRecord

STATUS_STATE = {Status.PASS: "success", Status.REJECT: "failure", Status.INFRA_ERROR: "error",
                Status.INCONCLUSIVE: "pending"}  # fmt: skip


def verdict_decision(pr: PullRequest, rec: EvaluationRecord, rules: Rules, claim: TemplateFacts, *, cleared: bool,
                     round_note: str = "", stopped: str = "", automerge_env: bool | None = None,
                     earlier: Iterable[EvaluationRecord] = ()) -> Decision | None:  # fmt: skip
    """The Decision that publishes `rec`'s verdict on `pr`; None for a record without one.

    `cleared`: a maintainer's `evalbot clear` of this head, which lifts the claim-gap label; `round_note`:
    the PR's place in its round; `stopped`: why intake does not measure it again; `automerge_env`: the
    operator's flag (None: not known here), which with the rules says whether a PASS can merge itself;
    `earlier`: the PR's other judged evaluations, whose verdicts' labels (`stale_labels`) come off too."""
    v, m = rec.verdict, rec.measurements
    if v is None or m is None:
        return None
    gap = measured_claim_gap(claim, v, rules)
    approval = rounds.approval_needed(pr.paths, pr.labels, rules) if v.status is Status.PASS else None
    standing = render.Standing(claim=gap.reason if gap else "", claim_flagged=bool(gap and gap.flagged),
                               approval=approval or "", round=round_note, stopped=stopped,
                               merge=_merge_note(v, rules, automerge_env))  # fmt: skip
    signature = receipts.signature_status(rec.receipt) if rec.receipt else "unsigned"
    body = render.render_comment(v, m, signature_status=signature, standing=standing)
    # claim-gap is applied, not only written: the rules decide whether it blocks auto-merge
    claim_label = (rules.labels.claim_gap,) if gap is not None and gap.flagged and not cleared else ()
    state = STATUS_STATE.get(v.status)
    status = (state, f"{v.status.value}{' ' + v.tier if v.tier else ''}") if state else None
    owned = rules.owned(LabelFamily.VERDICT) | rules.owned(LabelFamily.CLAIM) | stale_labels(earlier, rules)
    return Decision((*v.labels_add, *claim_label), tuple(sorted(owned)), comment=body, status=status)


def stale_labels(earlier: Iterable[EvaluationRecord], rules: Rules) -> frozenset[str]:
    """The labels earlier verdicts of a PR added that no longer belong to a family the bot decides: a label
    renamed in the rules (`perf-small:XS` once tracks.yaml calls the model's label `perf-0.5b`), or a track
    or tier taken out. The rules' families know only today's names, so without these an old verdict's label
    would stay on the PR for good, and read as today's. A label the rules now give another family (a
    maintainer's hold, a screen's flag) is left to that family."""
    others = frozenset().union(
        *(rules.owned(f) for f in LabelFamily if f not in (LabelFamily.VERDICT, LabelFamily.CLAIM))
    )
    added = {label for r in earlier if r.verdict is not None for label in r.verdict.labels_add}
    return frozenset(added - others)


def _merge_note(v: Verdict, rules: Rules, automerge_env: bool | None) -> str:
    """Where a PASS cannot merge itself: which switch is off (the rules' or the operator's)."""
    if v.status is not Status.PASS or automerge_env is None:
        return ""
    if not rules.automerge.enabled:
        return "auto-merge is off in rules/automerge.yaml: a maintainer merges"
    if not automerge_env:
        return "the operator has not turned auto-merge on (EVALBOT_AUTOMERGE=1): a maintainer merges"
    return ""


def measured_claim_gap(claim: TemplateFacts, v: Verdict, rules: Rules) -> ClaimGap | None:
    """The contributor's claim against the measurement at the scored context; None without a claim."""
    claimed = claim.claimed_gain_at(v.scored_context)
    if claimed is None:
        return None
    h = v.headline
    best = h if h and h.context == v.scored_context and h.metric in DECODE_METRICS else None
    measured = (best.ratio - 1.0) if best else None
    lower = (best.ci_low - 1.0) if best else None
    return claim_gap(claimed, lower, measured, rules)
