"""Blocklist: a PR opened, authored, co-authored or committed by a blocked person is flagged and closed unevaluated.

The blocklist is the rules' ``policy.blocklist`` joined with the store's (maintainers' ``block`` commands),
passed in as data. Logins compare case-insensitively, as GitHub's do. A commit whose email maps to no
GitHub account is matched by its git name instead, so an unlinked email does not slip a blocked login
through. Maintainers are not exempt.
"""

from __future__ import annotations

from collections.abc import Iterable

from evalbot.model import Prose, PullRequest
from evalbot.policy.decision import PolicyDecision, stop
from evalbot.rules import Rules


def blocked_people(pr: PullRequest, blocked: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """(role, name) of every opener, commit author or committer of the PR who is on the blocklist."""
    names = {b.casefold() for b in blocked}
    found: list[tuple[str, str]] = []

    def see(role: str, name: str | None) -> None:
        if name and name.casefold() in names and (role, name) not in found:
            found.append((role, name))

    see("opener", pr.author)
    for c in pr.commits:
        see(f"author of {c.sha[:12]}", c.author)
        see(f"committer of {c.sha[:12]}", c.committer)
        if c.author is None:
            see(f"git author name of {c.sha[:12]}", c.author_name.strip())
        if c.committer is None:
            see(f"git committer name of {c.sha[:12]}", c.committer_name.strip())
        for who in c.co_authors:
            see(f"co-author of {c.sha[:12]}", who)
    return tuple(found)


def check(pr: PullRequest, rules: Rules, blocked: Iterable[str] = ()) -> PolicyDecision | None:
    """CLOSE_FLAG the PR if anyone behind it is blocked (rules' list plus ``blocked``); None otherwise."""
    hits = blocked_people(pr, (*rules.policy.blocklist, *blocked))
    if not hits:
        return None
    who = ", ".join(f"{name} ({role})" for role, name in hits)
    people = {name.casefold(): name for _, name in reversed(hits)}  # one spelling each, the first seen
    comment = Prose.of("blocklist", logins=tuple(people[k] for k in sorted(people)))
    return stop("blocklist", f"blocklisted: {who}", rules.labels.gaming, comment, close=True)
