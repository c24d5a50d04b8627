"""Strikes: when an author's copycat strikes blocklist them and freeze their evaluations (pure).

A strike is a copycat block (``CopycatFinding.strike``). Reaching ``strikes.limit`` strikes within
``strikes.window_days`` puts the author on the blocklist, and their evaluations are frozen for a
penalty window of ``window_days`` from the strike that reached the limit. Warnings count toward
``warnings_to_block`` within the same window. Persisting strikes and the blocklist is the store's job.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from evalbot.rules import Copycat


@dataclass(frozen=True)
class Standing:
    """An author's copycat record as of one moment."""

    strikes_in_window: int  # strikes within window_days up to now
    blocklisted: bool  # the limit was reached within some window: the author belongs on the blocklist
    frozen_until: datetime | None  # end of the latest penalty window, if the limit was ever reached

    def frozen(self, now: datetime) -> bool:
        """Whether the author's evaluations are frozen at ``now``."""
        return self.frozen_until is not None and now < self.frozen_until


def standing(strikes: Iterable[datetime], now: datetime, rules: Copycat) -> Standing:
    """The author's standing at ``now`` from the times of their strikes (later ones are ignored)."""
    window = timedelta(days=rules.strikes.window_days)
    limit = rules.strikes.limit
    past = sorted(s for s in strikes if s <= now)
    reached = [past[i] for i in range(limit - 1, len(past)) if past[i] - past[i - limit + 1] <= window]
    return Standing(
        strikes_in_window=sum(1 for s in past if now - s < window),
        blocklisted=bool(reached),
        frozen_until=reached[-1] + window if reached else None,
    )


def prior_warnings(warnings: Iterable[datetime], now: datetime, rules: Copycat) -> int:
    """Copycat warnings the author got within the strikes window before ``now`` (for ``decide``)."""
    window = timedelta(days=rules.strikes.window_days)
    return sum(1 for t in warnings if t <= now and now - t < window)
