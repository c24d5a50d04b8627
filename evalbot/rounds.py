"""Rounds: PRs measured against the same main compete, the best merges first, the rest rebase. Pure.

A round is the set of PASS verdicts measured against one main sha. The PR with the largest lower-bound
gain (the 95% CI's lower bound of head/main at its scored context, minus one) is ``merge-first``;
the others get ``needs-rebase``. Ties, which need exactly equal bounds, go to the lower PR number, the
one opened earlier, so the order never depends on input order.

When main moves (a merge), every verdict measured against the old main is stale: its PR is labelled
``re-evaluate`` and is ranked again only once measured against the new main: what it is credited is
its lower-bound gain over the main it lands on (the poller writes it to the ledger at the merge).

Auto-merge (``may_automerge``) needs the rules' consent, the operator's flag, a PASS at or above the
minimum tier under the current rules, no hold and no blocking label, and the head still at the
measured sha (the merge itself must pass that sha, so a later push cannot ride along).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from evalbot.model import PullRequest, Status, Verdict, WorkflowRun
from evalbot.rules import DECODE_TRACK, Rules

MERGE_FIRST = "merge_first"
NEEDS_REBASE = "needs_rebase"
RE_EVALUATE = "re_evaluate"
HELD = "held"
OUT = "out"  # not a contender: not a PASS, or nothing scored


@dataclass(frozen=True)
class Contender:
    """A PR's latest verdict and the revisions it was measured on."""

    pr: int
    head_sha: str
    base_sha: str  # the main it was measured against
    verdict: Verdict


@dataclass(frozen=True)
class RoundDecision:
    """One PR's place in the round: the round label to set (the poller removes the others) and a comment."""

    pr: int
    role: str  # merge_first, needs_rebase, re_evaluate, held, out
    lower_bound_gain: float | None
    labels_add: tuple[str, ...]  # the round label to set; the family's others go (rules.owned)
    reason: str
    comment: str | None = None


@dataclass(frozen=True)
class RoundRanking:
    """The round against one main: the winner, the ranked PASSes, and every PR's decision. Each track ranks
    apart (merge-first is decided within a track): `winners` names each track's, and `order` puts them
    first (the decode track's, then the others' in the rules' order), then the rest by decode gain."""

    main_sha: str
    merge_first: int | None
    order: tuple[int, ...]  # ranked contenders, best first
    decisions: tuple[RoundDecision, ...]  # by PR number
    winners: tuple[tuple[str, int], ...] = ()  # (track, PR) per track that has a contender

    def decision(self, pr: int) -> RoundDecision:
        """The decision for one PR; KeyError if it was not in the round."""
        for d in self.decisions:
            if d.pr == pr:
                return d
        raise KeyError(pr)

    def tracks_won(self, pr: int) -> tuple[str, ...]:
        """The tracks whose round this PR leads."""
        return tuple(t for t, winner in self.winners if winner == pr)


def _pct(fraction: float) -> str:
    return f"{fraction * 100:+.1f}%"


def rank_round(
    contenders: Iterable[Contender], main_sha: str, rules: Rules, held: Collection[int] = ()
) -> RoundRanking:
    """Rank a round's PRs: merge-first, needs-rebase, re-evaluate (measured on an older main), held, out."""
    lab = rules.labels
    by_pr: dict[int, Contender] = {}
    for c in contenders:
        if c.pr in by_pr:
            raise ValueError(f"PR {c.pr} appears twice in the round; pass each PR's latest verdict once")
        by_pr[c.pr] = c

    def decide(c: Contender, role: str, gain: float | None, reason: str, label: str | None = None,
               comment: str | None = None) -> RoundDecision:  # fmt: skip
        add = (label,) if label else ()
        return RoundDecision(c.pr, role, gain, add, reason, comment)

    decisions: dict[int, RoundDecision] = {}
    ranked: list[tuple[float, int]] = []
    for pr, c in by_pr.items():
        gain = c.verdict.lower_bound_gain if c.verdict.status == Status.PASS else None
        if c.verdict.status != Status.PASS:
            decisions[pr] = decide(c, OUT, None, f"not a contender: the verdict is {c.verdict.status}")
        elif gain is None:
            decisions[pr] = decide(c, OUT, None, "not a contender: no scored decode estimate")
        elif c.base_sha != main_sha:
            reason = f"measured against {c.base_sha[:12]}, main is now {main_sha[:12]}"
            comment = (
                f"Main has moved since this pull request was measured (against {c.base_sha[:12]}; main is "
                f"now {main_sha[:12]}). The bot measures it again against the new main, and credits only its "
                "gain over it."
            )
            decisions[pr] = decide(c, RE_EVALUATE, gain, reason, lab.re_evaluate, comment)
        elif pr in held:
            decisions[pr] = decide(c, HELD, gain, "on hold by a maintainer: out of the ranking")
        else:
            ranked.append((gain, pr))

    ranked.sort(key=lambda t: (-t[0], t[1]))
    winners = _track_winners(ranked, by_pr, rules)
    leaders = list(dict.fromkeys(pr for _, pr in winners))
    order = tuple(leaders + [pr for _, pr in ranked if pr not in leaders])
    winner = order[0] if order else None
    for place, (gain, pr) in enumerate(ranked, 1):
        c = by_pr[pr]
        won = [t for t, w in winners if w == pr]
        if won:
            tracks = " and ".join(f"the {t} track" for t in won)
            reason = f"largest lower-bound gain in {tracks} ({_pct(gain)} decode): merges first"
            decisions[pr] = decide(c, MERGE_FIRST, gain, reason, lab.merge_first)
            continue
        best = ranked[0][0]
        reason = f"place {place} ({_pct(gain)}); #{winner} merges first ({_pct(best)})"
        comment = (
            f"#{winner} has the largest lower-bound gain in this round ({_pct(best)} against this pull "
            f"request's {_pct(gain)}) and merges first. Once it has landed, rebase on main: the bot then "
            "measures this pull request against the new main and credits only its gain over it."
        )
        decisions[pr] = decide(c, NEEDS_REBASE, gain, reason, lab.needs_rebase, comment)
    return RoundRanking(main_sha, winner, order, tuple(decisions[pr] for pr in sorted(decisions)), winners)


def _track_winners(
    ranked: list[tuple[float, int]], by_pr: dict[int, Contender], rules: Rules
) -> tuple[tuple[str, int], ...]:
    """Each track's leader among the ranked PASSes: decode by the decode gain (the ranking itself), every
    other track by its own lower-bound gain, and only where that track earned the PR a tier (a speculative
    score of "none" leads nothing). Ties go to the lower PR number."""
    out: list[tuple[str, int]] = []
    if ranked:
        out.append(
            (next((t.name for t in rules.scoring if t.metric == DECODE_TRACK), DECODE_TRACK), ranked[0][1])
        )
    names = list(dict.fromkeys(t.name for t in rules.scoring if t.metric != DECODE_TRACK))
    for name in names:
        scored = [(g, pr) for _, pr in ranked
                  if (g := by_pr[pr].verdict.track_gain(name)) is not None
                  and any(s.track == name and s.tier for s in by_pr[pr].verdict.scores)]  # fmt: skip
        if scored:
            out.append((name, min(scored, key=lambda t: (-t[0], t[1]))[1]))
    return tuple(out)


def approval_needed(paths: Iterable[str], labels: Iterable[str], rules: Rules) -> str | None:
    """Why a PR that changes tests, CI or build files waits for a maintainer (None when it need not)."""
    am = rules.automerge
    if not am.approval_paths or am.approval_label in set(labels):
        return None
    hits = [
        p
        for p in paths
        if any(
            p == a or (a.endswith("/") and p.startswith(a)) or p.endswith("/" + a) for a in am.approval_paths
        )
    ]
    if not hits:
        return None
    shown = ", ".join(hits[:5]) + (" …" if len(hits) > 5 else "")
    return (
        f"it changes files that are not benchmark code ({shown}): it merges on a speed verdict only once a "
        f"maintainer adds the {am.approval_label!r} label"
    )


def ci_verdict(runs: Iterable[WorkflowRun], rules: Rules) -> str | None:
    """Why the measured head's CI does not allow a merge (None when its newest run of the required
    workflow succeeded, or no workflow is required). `runs` are that workflow's runs on the head."""
    workflow = rules.automerge.required_ci_workflow
    if workflow is None:
        return None
    newest = max(runs, key=lambda r: (r.created_at, r.id), default=None)
    if newest is None:
        return f"CI ({workflow}) has not run on the measured head"
    if newest.status != "completed":
        return f"CI ({workflow}) is still {newest.status} on the measured head"
    if newest.conclusion != "success":
        return f"CI ({workflow}) ended {newest.conclusion} on the measured head"
    return None


def may_automerge(
    verdict: Verdict,
    labels: Iterable[str],
    rules: Rules,
    env_flag: bool,
    measured_sha: str,
    current_head_sha: str,
    held: bool = False,
) -> tuple[bool, str]:
    """Whether the bot may merge this PR now, and why (or why not)."""
    am = rules.automerge
    present = set(labels)
    if not am.enabled:
        return False, "auto-merge is disabled in rules/automerge.yaml"
    if not env_flag:
        return False, "the operator has not enabled auto-merge (EVALBOT_AUTOMERGE=1)"
    if verdict.status != Status.PASS:
        return False, f"the verdict is {verdict.status}, not PASS"
    if current_head_sha != measured_sha:
        return False, f"the head moved to {current_head_sha[:12]} after {measured_sha[:12]} was measured"
    if verdict.rules_hash != rules.rules_hash:
        # An unknown hash counts as changed: a merge must rest on a verdict under the rules in force.
        return False, "the verdict was not made under the rules in force: it must be measured again"
    if held:
        return False, "a maintainer put the PR on hold"
    blocking = sorted(present & set(am.blocking_labels))
    if blocking:
        return False, f"blocking label(s): {', '.join(blocking)}"
    missing = [label for label in am.required_labels if label not in present]
    if missing:
        return False, f"missing required label(s): {', '.join(missing)}"
    names = [t.name for t in rules.tiers]
    # the overall tier only: a track kept apart from it (overall: false) earns a label and a round, and a
    # maintainer merges its winner (a speculative rate is a softer clock than decode's two-part one)
    tier = verdict.tier
    if tier not in names:
        return False, f"no tier; auto-merge needs at least {am.min_tier}"
    if names.index(tier) < names.index(am.min_tier):
        return False, f"tier {tier} is below the auto-merge minimum {am.min_tier}"
    return True, f"PASS at tier {tier}, head {measured_sha[:12]} as measured, no blocking label"


@dataclass(frozen=True)
class MergeBlocker:
    """Why a round's winner does not merge now, and whether it is to be measured again."""

    why: str
    measure_again: bool = False


def merge_blocker(verdict: Verdict, measured_head: str, measured_base: str, fresh: PullRequest, main_now: str,
                  rules: Rules, *, main_branch: str, automerge_env: bool, held: bool) -> MergeBlocker | None:  # fmt: skip
    """Whether the winner may merge, from the PR and main read again just before the merge (CI aside).

    Only what was measured merges, where it was measured: the PR's base still the main branch, its head
    the measured head and main the measured base; otherwise the evaluation is queued again. Then the
    auto-merge rules, and a change to tests or CI waits for a maintainer.
    """
    if fresh.base_ref != main_branch:
        return MergeBlocker(f"it now targets {fresh.base_ref!r}, not {main_branch!r}")
    if main_now != measured_base or fresh.head_sha != measured_head:
        moved = "main" if main_now != measured_base else "the head"
        return MergeBlocker(f"{moved} moved since it was measured; measuring again", measure_again=True)
    ok, why = may_automerge(verdict, fresh.labels, rules, automerge_env, measured_head, fresh.head_sha, held)
    if not ok:
        return MergeBlocker(why)
    approval = approval_needed(fresh.paths, fresh.labels, rules)
    return MergeBlocker(approval) if approval else None
