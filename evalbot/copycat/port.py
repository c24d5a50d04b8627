"""What the poller asks of a copycat screen: the `Screen` protocol (`CopycatScreen` is the one the bot runs)."""

from __future__ import annotations

from typing import Protocol

from evalbot.model import Decision, PullRequest


class Screen(Protocol):
    """Screens a PR before its evaluation is queued, and follows main and the merges it is measured against."""

    def __call__(self, pr: PullRequest) -> Decision | None:
        """The screen's decision on one PR (labels, notice, close), or None when it has nothing to say."""
        ...

    def set_main(self, sha: str) -> None:
        """Main is now `sha`: its code is base code, never a copy of a PR."""
        ...

    def mark_merged(self, pr: int, at: str) -> None:
        """PR `pr` merged at `at`: its code is base code for every PR opened after it."""
        ...
