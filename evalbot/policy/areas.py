"""Area labels: which parts of the engine a PR touches, from ``policy.areas`` (ordered, first match wins).

Globs match whole repository paths: ``*`` and ``?`` stay within one folder, ``**`` spans folders (``a/**``
is everything under a/, ``**/x.py`` is x.py in any folder), ``[...]`` is a character class. Both sides
of a rename count.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from evalbot.model import PullRequest
from evalbot.policy.decision import Action, PolicyDecision
from evalbot.rules import Rules


@functools.lru_cache(maxsize=256)
def glob_regex(pattern: str) -> re.Pattern[str]:
    """A compiled regex for a path glob with ``**``."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end].replace("\\", "\\\\")
            # '!' negates as in fnmatch; a literal leading '^' must not negate in a regex
            body = "^" + body[1:] if body.startswith("!") else "\\" + body if body.startswith("^") else body
            out.append(f"[{body}]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def matches(path: str, pattern: str) -> bool:
    """Whether a repository path matches a glob."""
    return glob_regex(pattern).fullmatch(path) is not None


def area_of(path: str, rules: Rules) -> str | None:
    """The label of the first area with a glob matching the path; None if no area matches."""
    for area in rules.policy.areas:
        if any(matches(path, g) for g in area.paths):
            return area.label
    return None


def areas(paths: Iterable[str], rules: Rules) -> tuple[str, ...]:
    """The area labels the paths touch, in the rules' order."""
    touched = {area_of(p, rules) for p in paths}
    return tuple(a.label for a in rules.policy.areas if a.label in touched)


def check(pr: PullRequest, rules: Rules) -> PolicyDecision:
    """LABEL the PR with the areas it touches; evaluation goes ahead."""
    labels = areas(pr.paths, rules)
    reason = f"areas: {', '.join(labels)}" if labels else "areas: none (no changed files)"
    return PolicyDecision("areas", Action.LABEL, True, reason, labels_add=labels)
