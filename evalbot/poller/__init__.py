"""The bot's loop, one `poll_once` at a time: intake, copycat, queue, evaluate, verdict, publish, rounds.

Every decision is made by the pure modules (policy, copycat, verdict, rounds) from facts gathered
here; every side effect goes through `Publisher` (idempotent, crash-safe) or the store. Main is the
remote's main fetched fresh into the mirror before anything is measured, a PR is measured at the head
GitHub reports, and a merge names that head's sha. Killing the bot at any point and starting it again
loses nothing (queued evaluations and action intents live in the store) and repeats nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from pathlib import Path

from evalbot import dispatch, times
from evalbot.copycat import Screen
from evalbot.github import GitHubPort
from evalbot.judge import Evaluator, Judgement
from evalbot.ledgers import LedgerBook
from evalbot.mirror import Mirror
from evalbot.model import (
    Decision,
    EvalRequest,
    Notice,
    Prose,
    PullRequest,
    RunOptions,
    Status,
    Verdict,
    cap_text,
)
from evalbot.policy import IntakeContext, TemplateFacts, intake
from evalbot.poller.round_step import RoundStep
from evalbot.publish import Publisher
from evalbot.rules import LabelFamily, Rules
from evalbot.store import DEFAULT_LEASE_S, EvalKey, LeaseKeeper, Store, worker_id
from evalbot.store import DEFAULT_MAX_ATTEMPTS as MAX_ATTEMPTS

Log = Callable[[str], None]


@dataclass(frozen=True)
class BotSettings:
    """How this bot instance runs (the CLI reads env and flags into this; nothing here reads the env)."""

    main_branch: str = "main"
    bot_login: str | None = None
    worker: str = field(default_factory=worker_id)  # host:pid:random: each bot its own lease and claims
    automerge_env: bool = False  # the operator's EVALBOT_AUTOMERGE=1
    merge_method: str = "squash"
    ledger_remote: str | None = None  # where FLAGGED.md and blocked-contributors.txt are committed
    force_listing_every: int = 12  # a full (unconditional) listing every this many polls
    options: RunOptions = field(
        default_factory=RunOptions
    )  # how each evaluation measures (the profile is the rules')
    work_dir: Path = Path("evalbot-work")  # where artifacts are unpacked (actions mode)
    lease_ttl_s: float = 120.0  # the store's poller lease lapses this long after the last heartbeat


@dataclass
class PollReport:
    """What one poll did, for the CLI and the tests."""

    idle: bool = False
    main_sha: str = ""
    seen: list[int] = field(default_factory=list)
    evaluated: list[int] = field(default_factory=list)
    merged: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class _Poll:
    """What one poll learns as it goes; dropped when it ends."""

    report: PollReport = field(default_factory=PollReport)
    main_sha: str = ""
    facts: dict[int, PullRequest] = field(default_factory=dict)  # each open PR, read once a poll
    labels: dict[int, set[str]] = field(default_factory=dict)  # each PR's labels as this poll left them
    claims: dict[int, TemplateFacts] = field(default_factory=dict)  # each PR's description, parsed once
    protected: dict[int, set[str]] = field(default_factory=dict)  # blocking labels present when it began
    stopped: dict[int, str] = field(
        default_factory=dict
    )  # why intake stops a PR that has a verdict at its head


class Bot:
    """One repository's bot: GitHub, the store, the rules, the mirror and an evaluator."""

    def __init__(self, gh: GitHubPort, store: Store, rules: Rules, settings: BotSettings, mirror: Mirror,
                 evaluator: Evaluator, log: Log, *, screen: Screen | None = None,
                 now: Callable[[], datetime] = times.now, dry_run: bool = False,
                 lease: LeaseKeeper | None = None, owner_gone: Callable[[str], bool] = lambda _owner: False):  # fmt: skip
        self.gh, self.store, self.rules, self.settings, self.mirror = gh, store, rules, settings, mirror
        self.evaluator, self.log, self.screen, self.now = evaluator, log, screen, now
        self.publisher = Publisher(gh, store, bot_login=settings.bot_login, log=log, dry_run=dry_run)
        self.book = LedgerBook(store, settings.ledger_remote, log, now, dry_run=dry_run)
        self.dry_run = dry_run
        self._p = _Poll()
        self._polls = 0
        self._listing: tuple[PullRequest, ...] = ()
        self._dispatch_runs: dispatch.DispatchRuns | None = None
        self._rounds = RoundStep(self)
        # one poller per store, held in the store itself (the caller's keeper, already holding it, or the
        # bot's own, taken at the first poll); `owner_gone` says when another holder no longer runs
        self._lease = (
            lease
            if lease is not None or dry_run
            else LeaseKeeper(store.leases, settings.worker, settings.lease_ttl_s, gone=owner_gone)
        )
        self._leased = lease is not None

    # ------------------------------------------------------------------ the loop

    def poll_once(self) -> PollReport:
        """One step: gather the facts, decide (pure) and apply for every open PR, measure what is queued,
        rank the round and merge its winner, record. Each PR's step is contained: one PR, however
        hostile, never stops the poll."""
        self.take_lease()
        self._check_lease()
        p = self._p = _Poll()
        listing = self._gather()
        if listing is None:
            p.report.idle = True
            return p.report
        # the blocklist: hand edits of its ledger file into the store first, the store's list out last
        self._contained(None, "blocked ledger", self.book.sync_blocked)
        blocked = self.book.blocked()
        for summary in listing:
            self._contained(summary.number, "intake", partial(self._intake, summary.number, blocked))
        self._work_queue()
        self._rounds.run()
        self._contained(None, "blocked ledger", self.book.sync_blocked)
        return p.report

    def _gather(self) -> list[PullRequest] | None:
        """Reconcile half-done actions, list the open PRs and fetch main; None when nothing changed and
        nothing waits. Main is the remote's, fetched fresh: what is measured is measured against it."""
        self.book.begin_poll()
        if not self.dry_run:
            self.publisher.reconcile()
            if self._polls == 0:
                # one poller per store (this one holds the store's poller lease), so a claim another worker
                # id holds when this one starts belongs to a process that is gone; a live one is never taken
                self.store.queue.requeue_claims(except_worker=self.settings.worker)
                self._requeue_own_claims()
        listing = self.gh.list_open_pulls(force=self._polls % self.settings.force_listing_every == 0)
        self._polls += 1
        if listing is None and not self.store.queue.evaluations(state="queued"):
            return None
        if listing is not None:
            self._listing = listing
        self.mirror.fetch()
        self._p.main_sha = self._p.report.main_sha = self.mirror.sha(self.settings.main_branch)
        if self.screen is not None and not self.dry_run:
            self.screen.set_main(self._p.main_sha)
        return sorted(
            (s for s in self._listing if s.base_ref == self.settings.main_branch), key=lambda s: s.number
        )

    def take_lease(self) -> None:
        """Hold the store's poller lease from now until `close`; LeaseHeldError names another live holder."""
        if self._lease is not None and not self._leased:
            self._lease.start()
            self._leased = True

    def close(self) -> None:
        """Stop the lease's heartbeat and give the lease up."""
        if self._lease is not None and self._leased:
            self._lease.stop()
            self._leased = False

    def _check_lease(self) -> None:
        if self._lease is not None:
            self._lease.check()  # LeaseLostError: another poller took the store over; act no more

    def _contained(self, pr: int | None, step: str, call: Callable[[], object]) -> Exception | None:
        """Run one PR's step; whatever it raises is logged and noted for that PR (and returned), and the
        poll goes on with the others. A lost lease stops the poll before the step: nothing more is done."""
        self._check_lease()
        try:
            call()
            return None
        except Exception as exc:
            where = f"#{pr}" if pr is not None else "poll"
            note = f"{where}: {step} failed: {type(exc).__name__}: {cap_text(str(exc), 500)}"
            self.log(note)
            self._p.report.notes.append(note)
            return exc

    def _requeue_own_claims(self) -> None:
        """A process that just started holds no live claim: whatever this worker claimed before it died
        goes back to the queue now (not when its lease runs out), except evaluations a runner is measuring."""
        inflight = set()
        if self.rules.dispatch.mode == "actions":
            inflight = {(h.request.pr, h.request.head_sha, h.request.base_sha, h.request.rules_hash)
                        for h in self._runs().in_flight()}  # fmt: skip
        for rec in self.store.queue.evaluations(state="claimed"):
            k = rec.key
            if (
                rec.claimed_by == self.settings.worker
                and (k.pr, k.head_sha, k.base_sha, k.rules_hash) not in inflight
            ):
                self.store.queue.release_evaluation(
                    k, self.settings.worker, "the bot restarted while measuring it"
                )

    # ------------------------------------------------------------------ intake

    def _since_clear(self, pr: int) -> tuple[Verdict, ...]:
        last = max((times.parse(c.at) for c in self.store.moderation.clears(pr)), default=None)
        return tuple(r.verdict for r in self.store.queue.evaluations(pr=pr, state="done")
                     if r.verdict is not None and r.finished_at is not None
                     and (last is None or times.parse(r.finished_at) > last))  # fmt: skip

    def _last_push(self, pr: PullRequest) -> str:
        # GitHub's facts carry no push time and updated_at moves with every label: the first time this
        # bot saw the head is the push time it can vouch for
        key = f"seen:{pr.number}:{pr.head_sha}"
        seen = self.store.meta(key)
        if seen is None:
            seen = times.stamp(self.now())
            if not self.dry_run:
                self.store.set_meta(key, seen)
        return max(seen, pr.created_at, key=times.parse)  # compared as times: the two come in two spellings

    def _intake(self, number: int, blocked: frozenset[str]) -> None:
        """Read one PR, decide what intake and the copycat screen make of it, apply that, and queue its
        head against main unless a decision stopped it."""
        pr = self.gh.get_pull(number)
        p = self._p
        p.facts[pr.number] = pr
        p.report.seen.append(pr.number)
        lab = self.rules.labels
        # a maintainer's blocking labels, as GitHub shows them at the start of the poll: no screen of this
        # poll removes them (only `evalbot clear` does), and they block the merge
        p.protected[pr.number] = set(pr.labels) & self.rules.owned(LabelFamily.PROTECTED)
        if self.store.moderation.hold_for(pr.number) is not None or lab.hold in pr.labels:
            p.report.notes.append(f"#{pr.number}: on hold")
            return
        if self.store.moderation.cleared(pr.number, pr.head_sha):
            blocked = frozenset()  # a maintainer looked at this head's people and cleared it
        ctx = IntakeContext(now=self.now(), blocked=blocked, open_prs=self._listing,
                            verdicts=self._since_clear(pr.number), last_push_at=self._last_push(pr))  # fmt: skip
        intake_decision = intake(pr, self.rules, ctx)
        p.claims[pr.number] = intake_decision.claim  # the body, parsed once this poll
        if intake_decision.stopped_by == "drafts":
            return
        decision = intake_decision.as_decision(self.rules)
        if not decision.evaluate and decision.close is None and self._rounds.verdicts_at_head(pr):
            # the round publishes this head's verdict, with why it is not measured again: one comment
            # body a poll, never a notice and a verdict taking turns
            p.stopped[pr.number] = "; ".join(intake_decision.reasons) or str(intake_decision.stopped_by)
            decision = replace(decision, notice=None)
        if not self._apply(pr, decision):
            return
        if self.screen is not None:
            screened = self.screen(pr)
            if screened is not None and not self._apply(pr, screened):
                return
        main_sha = p.main_sha
        key = EvalKey(pr.number, pr.head_sha, main_sha, self.rules.rules_hash)
        rec = self.store.queue.evaluation(key)
        if rec is None and not self.dry_run:
            self.store.queue.enqueue_evaluation(key)
            self.log(f"#{pr.number}: queued {pr.head_sha[:12]} against main {main_sha[:12]}")

    def _apply(self, pr: PullRequest, decision: Decision) -> bool:
        """Apply one decision through the publisher (the one place that acts on GitHub), with its ledger
        flag and its line in the report; whether evaluation goes ahead.

        The PR's labels are read from GitHub once a poll (with its facts) and then followed through the
        bot's own changes, so no decision needs another read of the PR; the labels a maintainer or a
        screen set at the start of the poll are protected from every decision of this poll.
        """
        p = self._p
        if decision.flag:
            self.book.flag(pr.number, pr.author, decision.flag, "; ".join(decision.notice.lines if decision.notice
                                                                          else ()))  # fmt: skip
        current = p.labels.setdefault(pr.number, set(pr.labels))
        p.labels[pr.number] = self.publisher.apply(pr, decision, current, p.protected.get(pr.number, ()))
        if decision.note:
            p.report.notes.append(f"#{pr.number}: {decision.note}")
        return decision.evaluate

    def _relabel(self, pr: PullRequest, want: Iterable[str], owned: Iterable[str]) -> None:
        """Make the labels in `owned` exactly `want` (a set difference; every other label untouched)."""
        self._apply(pr, Decision(tuple(want), tuple(owned)))

    # ------------------------------------------------------------------ evaluation

    def _work_queue(self) -> None:
        """Measure (or dispatch) every queued evaluation this worker can claim; collect dispatched runs."""
        if self.dry_run:
            return
        facts, main_sha = self._p.facts, self._p.main_sha
        actions = self.rules.dispatch.mode == "actions"
        if actions:
            self._contained(None, "collecting dispatched runs", self._collect_dispatched)
        d = self.rules.dispatch
        # in actions mode a claim is held while its run is in flight, through every retry
        lease = d.timeout_minutes * 60 * d.max_attempts + 3600 if actions else None
        while (
            rec := self.store.queue.claim_next(self.settings.worker, lease_s=lease or DEFAULT_LEASE_S)
        ) is not None:
            key, pr = rec.key, facts.get(rec.key.pr)
            failed = self._contained(
                key.pr, "evaluation", partial(self._evaluate, key, pr, main_sha, actions)
            )
            if failed is not None:
                why = f"{type(failed).__name__}: {cap_text(str(failed), 500)}"
                self._contained(
                    key.pr, "recording the infra error", partial(self._evaluation_crashed, key, pr, why)
                )

    def _evaluate(self, key: EvalKey, pr: PullRequest | None, main_sha: str, actions: bool) -> None:
        """Measure (or dispatch) one claimed evaluation."""
        if pr is None or pr.head_sha != key.head_sha or key.base_sha != main_sha or pr.state != "open":
            # superseded while queued (a push, a merge to main, a close): record it, measure nothing
            why = "superseded: the PR or main moved before it was measured"
            self.store.queue.finish_evaluation(key, self.settings.worker, _skipped(self.rules, why))
            return
        req = self._request(key, pr)
        if req is None:
            return
        if actions:
            self._dispatch(key, pr, req)
            return
        self.log(
            f"#{key.pr}: evaluating {key.head_sha[:12]} (as {(req.measured_sha or '')[:12]}) "
            f"against main {key.base_sha[:12]}"
        )
        self._finish(key, self.evaluator(req, self.mirror.path))

    def _request(self, key: EvalKey, pr: PullRequest) -> EvalRequest | None:
        """The evaluation of the PR's head merged into main, on the profile the rules judge PRs on. The merge
        is made here, once, for both modes: a PR that conflicts is skipped before anything is measured."""
        self.mirror.fetch_commit(key.head_sha, f"refs/pull/{key.pr}/head")
        target = self.mirror.merge_commit(key.base_sha, key.head_sha)
        if target is None:
            why = f"conflicts with main {key.base_sha[:12]}: rebase it and push"
            self.store.queue.finish_evaluation(key, self.settings.worker, _skipped(self.rules, why))
            self._needs_rebase(pr, why)
            self._note(pr.number, why)
            return None
        profile = self.rules.profile(self.rules.dispatch.profile)
        return EvalRequest(key.base_sha, key.head_sha, target, key.rules_hash, profile, self.settings.options,
                           pr=pr.number, title=pr.title, author=pr.author, branch=pr.head_ref)  # fmt: skip

    def _evaluation_crashed(self, key: EvalKey, pr: PullRequest | None, why: str) -> None:
        """An evaluation that raised (an unfetchable head, a git fault, an evaluator crash): the PR's
        INFRA_ERROR, never its fault, with the cause in the note."""
        rec = self.store.queue.evaluation(key)
        if rec is None or rec.state != "claimed" or rec.claimed_by != self.settings.worker:
            return
        self._infra(key, pr or self.gh.get_pull(key.pr), why, False)

    def _finish(self, key: EvalKey, judged: Judgement) -> None:
        """Record a measured evaluation (the round publishes it); an INCONCLUSIVE one is queued again,
        within the store's attempt limit, since the box, not the PR, failed to resolve it."""
        self.store.queue.finish_evaluation(
            key, self.settings.worker, judged.verdict, judged.measurements, judged.receipt
        )
        self._p.report.evaluated.append(key.pr)
        rec = self.store.queue.evaluation(key)
        if judged.verdict.status is Status.INCONCLUSIVE and rec is not None and rec.attempts < MAX_ATTEMPTS:
            self.store.queue.requeue_evaluation(key, keep_attempts=True)
            self._note(key.pr, f"inconclusive (attempt {rec.attempts}); queued again")

    def _note(self, pr: int | None, text: str) -> None:
        self._p.report.notes.append(f"#{pr}: {text}" if pr is not None else text)

    # ------------------------------------------------------------------ the runner pool (actions mode)

    def _runs(self) -> dispatch.DispatchRuns:
        if self._dispatch_runs is None:
            self._dispatch_runs = dispatch.DispatchRuns(self.store.dispatches)
        return self._dispatch_runs

    def _dispatch(self, key: EvalKey, pr: PullRequest, ev: EvalRequest) -> None:
        """Send one claimed evaluation to the runner pool (the head as pushed: the runner checks it out)."""
        runs = self._runs()
        if any(r.state in ("dispatching", "in_flight") for r in runs.history(key.pr, key.head_sha, key.base_sha,
                                                                           key.rules_hash)):  # fmt: skip
            return
        req = dispatch.new_request(ev)
        out = dispatch.start(self.gh, self.rules, runs, req, self.now())
        if isinstance(out, dispatch.Failed):
            self._infra(key, pr, out.reason, out.alert)
        else:
            self._note(key.pr, f"dispatched to the runner pool ({req.request_id})")

    def _collect_dispatched(self) -> None:
        """Advance every in-flight run; publish only what a runner signed and the rules re-derive."""
        runs = self._runs()
        for handle in runs.in_flight():
            r = handle.request
            key = EvalKey(r.pr, r.head_sha, r.base_sha, r.rules_hash)
            out = dispatch.advance(self.gh, self.rules, runs, handle, self.now(), self.settings.work_dir / "artifacts",
                                   self._runner_of)  # fmt: skip
            rec = self.store.queue.evaluation(key)
            if isinstance(out, dispatch.Pending) or rec is None or rec.state != "claimed":
                continue
            if isinstance(out, dispatch.Finished):  # verified; the round publishes it
                self._finish(key, out.judgement)
            elif out.retried_as is None:
                self._infra(key, self._p.facts.get(r.pr) or self.gh.get_pull(r.pr), out.reason, out.alert)

    def _runner_of(self, run_id: int) -> str | None:
        return dispatch.runner_of(self.gh, run_id)

    def _infra(self, key: EvalKey, pr: PullRequest, reason: str, alert: bool) -> None:
        """An evaluation the pool could not deliver: INFRA_ERROR for the PR, an alert for maintainers."""
        v = dispatch.infra_verdict(self.rules, reason)
        self.store.queue.finish_evaluation(key, self.settings.worker, v)
        if alert:
            self.log(f"ALERT #{key.pr}: {reason}")
            self._note(None, f"ALERT #{key.pr}: {reason}")
        notice = Notice("infra", "infra error", prose=(Prose.of("infra", reason=reason),))
        self._apply(pr, Decision((self.rules.labels.infra_error,), tuple(self.rules.owned(LabelFamily.VERDICT)),
                                 notice=notice))  # fmt: skip

    def _needs_rebase(self, pr: PullRequest, why: str) -> None:
        self._apply(pr, Decision((self.rules.labels.needs_rebase,), tuple(self.rules.owned(LabelFamily.ROUND)),
                                 notice=Notice("rebase", "needs a rebase", (why,))))  # fmt: skip


def _skipped(rules: Rules, why: str) -> Verdict:
    return Verdict(Status.SKIPPED, None, None, (), (why,), (), rules_hash=rules.rules_hash)
