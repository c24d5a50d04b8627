"""Apply a decision to GitHub exactly once: the one bot comment, labels as a set difference, close/reopen,
a commit status, and merges only at the measured sha.

Planning is pure (`plan_labels`, `bot_comment`). `Publisher` does the I/O, each action through the
store's two phases (intent, call, completion) keyed by `store.action_key`, so a bot killed at any point
neither repeats an action on restart nor forgets one: `reconcile` settles every intent left pending
by looking at GitHub (the marker comment's body, the label set, the PR's state).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from evalbot.github import GitHubPort
from evalbot.model import Comment, Decision, MergeOutcome, MergeResult, Notice, PullRequest
from evalbot.render import MARKER, fit_comment, render_notice, render_prose
from evalbot.store import ActionRecord, Store, action_key

Log = Callable[[str], None]


@dataclass(frozen=True)
class LabelChange:
    add: tuple[str, ...]
    remove: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.add or self.remove)


def plan_labels(current: Iterable[str], desired: Iterable[str], owned: Iterable[str]) -> LabelChange:
    """The labels to add and remove so that the bot-owned ones on a PR become `desired`; others untouched."""
    cur, want, mine = set(current), set(desired), set(owned) | set(desired)
    return LabelChange(tuple(sorted(want - cur)), tuple(sorted((cur & mine) - want)))


def bot_comment(comments: Iterable[Comment], bot_login: str | None) -> Comment | None:
    """The bot's own marker comment on a PR (the oldest, if a crash ever left two); never a user's copy."""
    mine = [c for c in comments if MARKER in c.body and (bot_login is None or c.author == bot_login)]
    return min(mine, key=lambda c: c.id, default=None)


def notice_body(pr: PullRequest, notice: Notice) -> str:
    """The bot comment of a notice; its markdown (already escaped) goes below the rendered lines."""
    body = render_notice(pr=pr.number, head_sha=pr.head_sha, title=notice.title, lines=notice.lines,
                         kind=notice.kind, author=pr.author)  # fmt: skip
    return body + ("\n" + render_prose(notice.prose) + "\n" if notice.prose else "")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Publisher:
    """Idempotent GitHub actions for one repository."""

    def __init__(
        self, gh: GitHubPort, store: Store, *, bot_login: str | None, log: Log, dry_run: bool = False
    ):
        self.gh, self.store, self.bot_login, self.log, self.dry_run = gh, store, bot_login, log, dry_run

    # --- the one applier ---

    def apply(
        self, pr: PullRequest, decision: Decision, current: Iterable[str], protected: Iterable[str] = ()
    ) -> set[str]:
        """Act on one decision, each action once: the labels of its family (less `protected`, which no
        decision takes off) as a set difference, its notice or comment as the PR's one bot comment, its
        commit status, then the close.
        Returns the PR's labels afterwards."""
        now = set(current)
        owned = set(decision.owned) - set(protected)
        desired = (now - owned) | set(decision.labels)
        self.labels(pr.number, pr.head_sha, now, desired, owned | set(decision.labels))
        if decision.notice is not None:
            self.comment(pr.number, pr.head_sha, notice_body(pr, decision.notice))
        if decision.comment is not None:
            self.comment(pr.number, pr.head_sha, decision.comment)
        if decision.status is not None:
            self.status(pr.head_sha, *decision.status, pr.number)
        if decision.close is not None and pr.state != "closed":
            self.close(pr.number, pr.head_sha, decision.close)
        return desired

    # --- actions ---

    def comment(self, pr: int, head_sha: str, body: str) -> bool:
        """Create or edit the PR's one bot comment to `body` (trimmed to GitHub's limit, saying so);
        True if GitHub was changed."""
        body = fit_comment(body)
        existing = bot_comment(self.gh.list_comments(pr), self.bot_login)
        if existing is not None and existing.body.strip() == body.strip():
            return False
        # keyed by the transition (what is there now -> what goes there), so A -> B -> A still edits
        key = action_key(
            "comment",
            pr,
            head_sha,
            {"from": _digest(existing.body) if existing else None, "to": _digest(body)},
        )
        if self.dry_run:
            self.log(f"#{pr}: would {'edit' if existing else 'post'} the bot comment")
            return True
        # planned from the live comment: a deleted or edited bot comment is put back, even if this very
        # transition was done before
        if not self.store.actions.begin_action(key, {"pr": pr, "body_digest": _digest(body)}, redo=True):
            return False
        if existing is None:
            made = self.gh.create_comment(pr, body)
            self.store.actions.finish_action(key, {"comment_id": made.id})
            self.log(f"#{pr}: posted the bot comment")
        else:
            self.gh.edit_comment(existing.id, body)
            self.store.actions.finish_action(key, {"comment_id": existing.id})
            self.log(f"#{pr}: edited the bot comment in place")
        return True

    def labels(
        self, pr: int, head_sha: str, current: Iterable[str], desired: Iterable[str], owned: Iterable[str]
    ) -> LabelChange:
        """Bring the bot-owned labels to `desired` (a set difference); returns what changed."""
        change = plan_labels(current, desired, owned)
        if not change:
            return change
        if self.dry_run:
            self.log(f"#{pr}: would add {list(change.add)} and remove {list(change.remove)}")
            return change
        key = action_key(
            "labels", pr, head_sha, {"now": sorted(set(current)), "add": change.add, "remove": change.remove}
        )
        # planned from the live labels: one the bot set and a human removed is restored, key or no key
        if not self.store.actions.begin_action(
            key, {"pr": pr, "add": change.add, "remove": change.remove}, redo=True
        ):
            return LabelChange((), ())
        if change.add:
            self.gh.add_labels(pr, change.add)
        for label in change.remove:
            self.gh.remove_label(pr, label)
        self.store.actions.finish_action(key, {"add": change.add, "remove": change.remove})
        self.log(f"#{pr}: labels +{list(change.add)} -{list(change.remove)}")
        return change

    def close(self, pr: int, head_sha: str, reason: str) -> bool:
        """Close an open PR (the caller saw it open); a reopened PR that must stay closed is closed again."""
        return self._state_change("close", pr, head_sha, reason, self.gh.close)

    def reopen(self, pr: int, head_sha: str, reason: str) -> bool:
        """Reopen a closed PR (the caller saw it closed)."""
        return self._state_change("reopen", pr, head_sha, reason, self.gh.reopen)

    def _state_change(
        self, kind: str, pr: int, head_sha: str, reason: str, call: Callable[[int], None]
    ) -> bool:
        if self.dry_run:
            self.log(f"#{pr}: would {kind} ({reason})")
            return True
        key = action_key(kind, pr, head_sha, reason)
        if not self.store.actions.begin_action(key, {"pr": pr, "reason": reason}, redo=True):
            return False
        call(pr)
        self.store.actions.finish_action(key, {"reason": reason})
        self.log(f"#{pr}: {kind}d ({reason})")
        return True

    def status(self, head_sha: str, state: str, description: str, pr: int | None = None) -> bool:
        """A commit status on the measured head (context 'evalbot'), once per (sha, state, description)."""
        if self.dry_run:
            return True
        key = action_key("status", pr, head_sha, {"state": state, "description": description})
        if not self.store.actions.begin_action(key, {"state": state}):
            return False
        self.gh.create_status(head_sha, state, "evalbot", description[:140])
        self.store.actions.finish_action(key, {"state": state})
        return True

    def merge(self, pr: int, measured_sha: str, method: str, title: str, message: str) -> MergeResult | None:
        """Merge at exactly the measured sha (GitHub refuses if the head moved); None if already done or dry."""
        if self.dry_run:
            self.log(f"#{pr}: would merge at {measured_sha[:12]}")
            return None
        key = action_key("merge", pr, measured_sha, method)
        if not self.store.actions.begin_action(key, {"pr": pr, "sha": measured_sha, "method": method}):
            return None
        result = self.gh.merge(pr, measured_sha, method, title, message)
        if result.outcome is MergeOutcome.MERGED:
            self.store.actions.finish_action(key, {"merged_sha": result.sha})
            self.log(f"#{pr}: merged at {measured_sha[:12]} -> {result.sha}")
        else:
            # not merged: nothing happened on GitHub, so the action may be tried again for this sha later
            self.store.actions.cancel_action(key, f"{result.outcome.value}: {result.message}")
            self.log(f"#{pr}: not merged ({result.outcome.value}: {result.message})")
        return result

    # --- restart ---

    def reconcile(self) -> list[str]:
        """Settle every action left pending by a crash by looking at GitHub; returns what was decided."""
        notes = []
        for rec in self.store.actions.pending_actions():
            happened = self._happened(rec)
            if happened:
                self.store.actions.finish_action(rec.key, {"reconciled": True})
            else:
                self.store.actions.cancel_action(rec.key, "not found on GitHub after a restart")
            notes.append(f"{rec.kind} #{rec.pr}: {'done' if happened else 'not done, will redo'}")
        for note in notes:
            self.log(f"reconciled {note}")
        return notes

    def _happened(self, rec: ActionRecord) -> bool:
        payload = rec.payload if isinstance(rec.payload, dict) else {}
        pr = rec.pr
        if pr is None:
            return False
        if rec.kind == "comment":
            existing = bot_comment(self.gh.list_comments(pr), self.bot_login)
            return existing is not None and _digest(existing.body) == payload.get("body_digest")
        facts = self.gh.get_pull(pr)
        if rec.kind == "labels":
            labels = set(facts.labels)
            return set(payload.get("add", ())) <= labels and not set(payload.get("remove", ())) & labels
        if rec.kind == "close":
            return facts.state == "closed"
        if rec.kind == "reopen":
            return facts.state == "open"
        if rec.kind == "merge":
            return facts.merged
        return False  # statuses and anything else: redoing is harmless
