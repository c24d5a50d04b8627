"""Sensitive paths: a PR that could change the judge or the yardstick is not evaluated by the bot.

An entry ending in '/' covers everything under that folder (and a file or link that replaces the folder
itself); any other entry is one exact path. Both sides of a rename count, so moving a harness file out
is caught too. Maintainers are exempt: changing the harness is their job, and they review it by hand.
"""

from __future__ import annotations

from collections.abc import Iterable

from evalbot.model import PullRequest
from evalbot.policy.decision import Action, PolicyDecision, is_maintainer
from evalbot.render import escape_md
from evalbot.rules import Rules

_LISTED = 20  # paths named in the comment; the rest are counted


def sensitive_hits(paths: Iterable[str], sensitive: Iterable[str]) -> tuple[str, ...]:
    """The paths (in order, each once) that fall under a sensitive entry."""
    entries = tuple(sensitive)
    hits: list[str] = []
    for path in paths:
        for entry in entries:
            under = entry.endswith("/") and (path.startswith(entry) or path == entry.rstrip("/"))
            if (under or path == entry) and path not in hits:
                hits.append(path)
                break
    return tuple(hits)


def check(pr: PullRequest, rules: Rules) -> PolicyDecision | None:
    """SKIP a non-maintainer's PR that touches a sensitive path; None otherwise."""
    hits = sensitive_hits(pr.paths, rules.policy.sensitive_paths)
    if not hits or is_maintainer(pr):
        return None
    listed = "\n".join(f"- {escape_md(p, limit=200)}" for p in hits[:_LISTED])
    more = f"\n- … and {len(hits) - _LISTED} more" if len(hits) > _LISTED else ""
    comment = (
        "This pull request is not evaluated automatically: it changes files that decide how PRs are "
        "measured or judged (the bot, its rules, the benchmark harness or CI):\n\n"
        f"{listed}{more}\n\n"
        "A maintainer will review it by hand. To have a speedup measured, move these changes to a "
        "separate pull request."
    )
    return PolicyDecision(
        "sensitive_paths",
        Action.SKIP,
        False,
        f"touches sensitive paths: {', '.join(hits)}",
        labels_add=(rules.labels.skipped_sensitive,),
        comment=comment,
    )
