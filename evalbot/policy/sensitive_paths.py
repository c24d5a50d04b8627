"""Sensitive paths: a PR that could change the judge or the yardstick is not evaluated by the bot.

An entry ending in '/' covers everything under that folder (and a file or link that replaces the folder
itself); any other entry is one exact path. Both sides of a rename count, so moving a harness file out
is caught too. Maintainers are exempt: changing the harness is their job, and they review it by hand.
"""

from __future__ import annotations

from collections.abc import Iterable

from evalbot.model import Prose, PullRequest
from evalbot.policy.decision import PolicyDecision, is_maintainer, stop
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


def shadows(path: str, module: str) -> bool:
    """Whether a file at path could be imported as module (dotted; `pkg.__init__` names a package's
    own code): the module's file under any suffix (.py, .pyc, an extension module's .so), a package
    directory of that name (which wins over the file), or its bytecode in __pycache__."""
    parts = module.split(".")
    stem = "/".join(parts)
    folder, leaf = "/".join(parts[:-1]), parts[-1]
    if path == stem or path.startswith(stem + "/"):
        return True
    where, _, name = path.rpartition("/")
    if name.split(".", 1)[0] != leaf or "." not in name:
        return False
    return where == folder or where == (f"{folder}/__pycache__" if folder else "__pycache__")


def module_hits(paths: Iterable[str], modules: Iterable[str]) -> tuple[str, ...]:
    """The paths (in order, each once) that could be imported as one of the harness modules."""
    mods = tuple(modules)
    return tuple(dict.fromkeys(p for p in paths if any(shadows(p, m) for m in mods)))


def harness_hits(paths: Iterable[str], rules: Rules) -> tuple[str, ...]:
    """Sensitive paths and harness-module shadows among paths, in order, each once."""
    paths = tuple(paths)
    return tuple(
        dict.fromkeys(
            (
                *sensitive_hits(paths, rules.policy.sensitive_paths),
                *module_hits(paths, rules.harness_modules),
            )
        )
    )


def check(pr: PullRequest, rules: Rules) -> PolicyDecision | None:
    """SKIP a non-maintainer's PR that touches a sensitive path or shadows a harness module; None otherwise."""
    hits = harness_hits(pr.paths, rules)
    if not hits or is_maintainer(pr):
        return None
    comment = Prose.of("sensitive_paths", paths=tuple(hits[:_LISTED]), more=max(len(hits) - _LISTED, 0))
    return stop(
        "sensitive_paths",
        f"touches sensitive paths: {', '.join(hits)}",
        rules.labels.skipped_sensitive,
        comment,
    )
