"""Timestamps: one type (an aware datetime), one text form, parsed back before any comparison.

The text form is fixed-width ISO 8601 UTC with microseconds, ``2026-11-30T10:00:00.000000Z``. Python code
compares parsed datetimes; SQL compares ``julianday()`` of the text, never the text itself. ``parse``
reads every ISO 8601 form the bot has written or GitHub sends (``Z`` or an offset) and refuses naive times.
"""

from __future__ import annotations

from datetime import UTC, datetime

_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def now() -> datetime:
    """The current moment, aware (UTC)."""
    return datetime.now(UTC)


def stamp(moment: datetime | None = None) -> str:
    """A timezone-aware moment (default: now) as the one text form: 2026-11-30T10:00:00.000000Z."""
    if moment is None:
        moment = now()
    if not isinstance(moment, datetime):
        raise TypeError(f"expected a datetime, got {type(moment).__name__}")
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"expected a timezone-aware datetime, got naive {moment.isoformat()}")
    return moment.astimezone(UTC).strftime(_FORMAT)


def parse(text: str, *, naive_is_utc: bool = False) -> datetime:
    """An ISO 8601 time with a zone (``Z`` or ``+HH:MM``) as an aware UTC datetime; ValueError otherwise.
    With ``naive_is_utc``, a time without a zone is read as UTC (display and older fixtures; never the
    store, whose times always carry one)."""
    if not isinstance(text, str):
        raise TypeError(f"expected ISO 8601 text, got {type(text).__name__}")
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise ValueError(f"not an ISO 8601 time: {text[:40]!r}") from None
    if (moment.tzinfo is None or moment.utcoffset() is None) and naive_is_utc:
        moment = moment.replace(tzinfo=UTC)
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"a time without a zone is ambiguous: {text[:40]!r}")
    return moment.astimezone(UTC)
