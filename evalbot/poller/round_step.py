"""One poll's round: rank this main's round (pure, `rounds`), publish every verdict with its place, and
merge the best PASS that still holds, the next one taking its place where GitHub refuses."""

from __future__ import annotations

from typing import TYPE_CHECKING

from evalbot import rounds, times
from evalbot.model import MergeOutcome, PullRequest, Status, WorkflowRun, cap_text
from evalbot.policy import parse_body
from evalbot.rules import LabelFamily
from evalbot.store import EvalKey, EvaluationRecord
from evalbot.verdict import verdict_decision

if TYPE_CHECKING:
    from evalbot.poller import Bot


class RoundStep:
    """The round and the merge of one bot (its collaborators and the poll's facts are the bot's)."""

    def __init__(self, bot: Bot):
        self.bot = bot

    def verdicts_at_head(self, pr: PullRequest) -> list[EvaluationRecord]:
        """The finished, judged evaluations of the PR's current head under the current rules: what a
        round ranks and publishes."""
        return [r for r in self.bot.store.queue.evaluations(pr=pr.number, state="done")
                if r.key.head_sha == pr.head_sha and r.verdict is not None
                and r.verdict.status != Status.SKIPPED and r.key.rules_hash == self.bot.rules.rules_hash]  # fmt: skip

    def run(self) -> None:
        """Rank this main's round (pure), publish every verdict with its place, merge the best PASS."""
        facts, main_sha = self.bot._p.facts, self.bot._p.main_sha
        contenders, records = [], {}
        for pr in facts.values():
            if pr.draft:  # a draft never reaches a round, whatever was measured before it became one
                continue
            done = self.verdicts_at_head(pr)
            if not done:
                continue
            latest = max(done, key=lambda r: (r.key.base_sha == main_sha, r.finished_at or ""))
            records[pr.number] = latest
            assert latest.verdict is not None  # verdicts_at_head keeps judged evaluations only
            contenders.append(rounds.Contender(pr.number, pr.head_sha, latest.key.base_sha, latest.verdict))
        held = {h.pr for h in self.bot.store.moderation.holds()}
        ranking = rounds.rank_round(contenders, main_sha, self.bot.rules, held)
        self._record_round(ranking, facts)
        owned = self.bot.rules.owned(LabelFamily.ROUND)
        for d in ranking.decisions:
            # every verdict is published here, once a poll with its place in the round: a no-op when
            # GitHub shows it already, and the repair when a crash came between measuring and publishing
            def publish(d: rounds.RoundDecision = d) -> None:
                self.bot._relabel(facts[d.pr], d.labels_add, owned)
                pr, p = facts[d.pr], self.bot._p
                claim = p.claims.get(pr.number)
                if claim is None:  # a PR intake did not read this poll (on hold): parse it now, once
                    claim = p.claims[pr.number] = parse_body(pr.body)
                decision = verdict_decision(
                    pr,
                    records[d.pr],
                    self.bot.rules,
                    claim,
                    cleared=self.bot.store.moderation.cleared(pr.number, pr.head_sha),
                    round_note=d.comment or "",
                    stopped=p.stopped.get(pr.number, ""),
                    automerge_env=self.bot.settings.automerge_env,
                    earlier=self.bot.store.queue.evaluations(pr=d.pr),
                )
                if decision is not None:
                    self.bot._apply(pr, decision)

            self.bot._contained(d.pr, "publishing", publish)
        # the best PASS merges; when GitHub refuses it (a conflict, a failing required check), the next
        # one takes its place and the refused PR is told to rebase
        for place, number in enumerate(ranking.order):
            outcome: list[str] = []

            def promote(n: int = number) -> None:
                self.bot._relabel(facts[n], {self.bot.rules.labels.merge_first}, owned)

            def merge(n: int = number, o: list[str] = outcome) -> None:
                o.append(self.maybe_merge(facts[n], records[n], ranking.tracks_won(n)))

            if place:  # the one before was refused: this PASS takes its place in the round
                self.bot._contained(number, "promoting", promote)
            self.bot._contained(number, "merging", merge)
            if outcome != ["refused"]:
                break

    def _record_round(self, ranking: rounds.RoundRanking, facts: dict[int, PullRequest]) -> None:
        """The round against this main, in the store: its ranked PRs and their lower-bound gains."""
        if self.bot.dry_run or not ranking.order:
            return
        round_id = ranking.main_sha
        self.bot.store.rounds.open_round(round_id, ranking.main_sha)
        for d in ranking.decisions:
            if d.pr in ranking.order:
                self.bot.store.rounds.set_round_member(
                    round_id, d.pr, facts[d.pr].head_sha, d.lower_bound_gain
                )

    def _ci_runs(self, head_sha: str) -> tuple[WorkflowRun, ...]:
        workflow = self.bot.rules.automerge.required_ci_workflow
        if workflow is None:
            return ()
        return self.bot.gh.list_workflow_runs(workflow, head_sha=head_sha, limit=20)

    def maybe_merge(self, pr: PullRequest, rec: EvaluationRecord, tracks_won: tuple[str, ...] = ()) -> str:
        """Merge a round's winner if everything still holds; 'merged', 'refused' (GitHub said no) or 'no'.

        Only what was measured merges, where it was measured: the PR and main are read again first, and
        the merge goes ahead only with the PR's base still the main branch, its head the measured head and
        main the measured base. Otherwise the evaluation is queued again.
        """
        assert rec.verdict is not None
        fresh = self.bot.gh.get_pull(pr.number) if not self.bot.dry_run else pr
        main_now = rec.key.base_sha
        if not self.bot.dry_run and fresh.base_ref == self.bot.settings.main_branch:
            self.bot.mirror.fetch()
            main_now = self.bot.mirror.sha(self.bot.settings.main_branch)
        blocker = rounds.merge_blocker(rec.verdict, rec.key.head_sha, rec.key.base_sha, fresh, main_now, self.bot.rules,
                                       main_branch=self.bot.settings.main_branch, automerge_env=self.bot.settings.automerge_env,
                                       held=self.bot.store.moderation.hold_for(pr.number) is not None)  # fmt: skip
        if (
            blocker is None
        ):  # a speed verdict is no licence to weaken the tests: CI must pass on the measured head
            ci = rounds.ci_verdict(self._ci_runs(rec.key.head_sha), self.bot.rules)
            blocker = rounds.MergeBlocker(ci) if ci else None
        if blocker is not None:
            self.bot._note(pr.number, f"not merged: {blocker.why}")
            if blocker.measure_again and not self.bot.dry_run:
                self.bot.store.queue.enqueue_evaluation(
                    EvalKey(pr.number, fresh.head_sha, main_now, self.bot.rules.rules_hash)
                )
            return "no"
        title = f"{pr.title} (#{pr.number})"
        message = f"Merged by evalbot at the measured head {rec.key.head_sha}: {rec.verdict.status.value} {rec.verdict.tier}"
        result = self.bot.publisher.merge(
            pr.number, rec.key.head_sha, self.bot.settings.merge_method, title, message
        )
        if result is None:
            return "no"
        if result.outcome is MergeOutcome.MERGED:
            gain = rec.verdict.lower_bound_gain
            self.bot.store.rounds.record_ledger("merge", pr.number, rec.key.head_sha, pr.author, gain, gain)
            for track in tracks_won:  # a PR that led two tracks' rounds is credited in both
                track_gain = rec.verdict.track_gain(track)
                self.bot.store.rounds.record_track_credit(track, pr.number, rec.key.head_sha, pr.author,
                                                          gain if track_gain is None else track_gain)  # fmt: skip
            self.bot.store.rounds.close_round(rec.key.base_sha, pr.number)
            if self.bot.screen is not None:
                self.bot.screen.mark_merged(pr.number, times.stamp(self.bot.now()))
            self.bot._p.report.merged.append(pr.number)
            return "merged"
        if result.outcome is MergeOutcome.HEAD_MOVED:
            # never force: the new head is measured like any push
            self.bot._relabel(
                pr, {self.bot.rules.labels.re_evaluate}, self.bot.rules.owned(LabelFamily.ROUND)
            )
            self.bot._note(pr.number, "head moved before the merge; re-evaluating")
            return "no"
        self.bot._note(pr.number, f"not mergeable: {result.message}")
        self.bot._needs_rebase(fresh, f"GitHub refused to merge it: {cap_text(result.message, 300)}")
        return "refused"
