"""Pure decisions for talking to GitHub: how long to wait after a refusal, how to back off after a fault.

No I/O and no PyGithub. The adapter in ``evalbot.github`` feeds in what GitHub answered and sleeps for
what these functions return, so every rule here is testable without a clock or a network.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass

TRANSIENT_STATUSES = frozenset({500, 502, 503, 504})
# GitHub's documented advice when a secondary limit comes without Retry-After: wait at least a minute.
SECONDARY_DEFAULT_WAIT = 60.0
# X-RateLimit-Reset is an epoch second on GitHub's clock; a second of slack covers skew and rounding.
RESET_SLACK = 1.0
# A Retry-After of 0 would let a misbehaving server spin us without ever reaching the wait cap.
MIN_RATE_WAIT = 1.0

_SECONDARY_MESSAGES = (
    re.compile(r"^you have exceeded a secondary rate limit"),
    re.compile(r"please retry your request again later\.?$"),
    re.compile(r"please wait a few minutes before you try again\.?$"),
)


@dataclass(frozen=True)
class RetryPolicy:
    """How hard one request tries before GitHub is declared unavailable."""

    attempts: int = 5  # tries for 5xx and timeouts, the first one included
    base_delay: float = 1.0  # seconds before the first retry, doubled after each fault
    max_delay: float = 30.0  # ceiling of one backoff
    max_rate_wait: float = 900.0  # total seconds one request may spend waiting out rate limits

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be at least 1, got {self.attempts}")
        if self.base_delay < 0 or self.max_delay < self.base_delay:
            raise ValueError(
                f"RetryPolicy needs 0 <= base_delay <= max_delay, got {self.base_delay} and {self.max_delay}"
            )
        if self.max_rate_wait < 0:
            raise ValueError(f"RetryPolicy.max_rate_wait must be >= 0, got {self.max_rate_wait}")


@dataclass(frozen=True)
class RateLimitWait:
    """GitHub refused because of a rate limit: wait this long, then ask again."""

    seconds: float
    kind: str  # "primary" (hourly quota spent) or "secondary" (too fast, too many at once)


def is_secondary_limit_message(message: str) -> bool:
    """Whether GitHub's error message is one of its secondary-rate-limit messages."""
    text = message.strip().lower()
    return any(pattern.search(text) for pattern in _SECONDARY_MESSAGES)


def rate_limit_wait(
    status: int, headers: Mapping[str, str], message: str, now: float
) -> RateLimitWait | None:
    """How long GitHub asks us to wait before retrying, or None when the refusal is no rate limit.

    ``headers`` are the response headers (any case); ``now`` is the epoch second on our clock.
    """
    if status not in (403, 429):
        return None
    lower = {name.lower(): value for name, value in headers.items()}
    retry_after = _seconds(lower.get("retry-after"))
    if retry_after is not None:
        return RateLimitWait(max(retry_after, MIN_RATE_WAIT), "secondary")
    if str(lower.get("x-ratelimit-remaining", "")).strip() == "0":
        reset = _seconds(lower.get("x-ratelimit-reset"))
        if reset is None:
            return RateLimitWait(SECONDARY_DEFAULT_WAIT, "primary")
        return RateLimitWait(max(reset - now, 0.0) + RESET_SLACK, "primary")
    # A 403 that is neither is a permission refusal: retrying it would only burn time.
    if status == 429 or is_secondary_limit_message(message):
        return RateLimitWait(SECONDARY_DEFAULT_WAIT, "secondary")
    return None


def is_transient(status: int) -> bool:
    """Whether an HTTP status is a server-side fault worth retrying (never the request's own fault)."""
    return status in TRANSIENT_STATUSES


def backoff_delay(fault: int, policy: RetryPolicy, rng: random.Random) -> float:
    """Seconds to wait after the ``fault``-th consecutive fault (0-based): doubling, capped, jittered.

    Half the delay is fixed and half random, so bots restarted together do not retry in lockstep.
    """
    ceiling = min(policy.max_delay, policy.base_delay * (2.0**fault))
    return ceiling / 2 + rng.uniform(0.0, ceiling / 2)


@dataclass(frozen=True)
class Step:
    """What to do after a failed try: sleep ``wait`` seconds and retry, or stop (``wait`` None) and say why."""

    wait: float | None
    reason: str
    rate_limited: bool = False  # the wait counts against max_rate_wait, not against attempts
    infra: bool = True  # stopping is an infrastructure fault; False: GitHub refused the request itself


def next_step(
    status: int | None,
    headers: Mapping[str, str],
    message: str,
    *,
    now: float,
    idempotent: bool,
    faults: int,
    rate_waited: float,
    policy: RetryPolicy,
    rng: random.Random,
) -> Step:
    """Decide after one failed try (``status`` None: no answer, e.g. a timeout) whether and when to retry.

    ``faults`` counts earlier server faults and ``rate_waited`` earlier rate-limit sleeps of this request.
    """
    if status is not None:
        wait = rate_limit_wait(status, headers, message, now)
        if wait is not None:
            if rate_waited + wait.seconds > policy.max_rate_wait:
                return Step(
                    None,
                    f"{wait.kind} rate limit: GitHub asks for {wait.seconds:.0f}s more after {rate_waited:.0f}s "
                    f"waited, past the cap of {policy.max_rate_wait:.0f}s ({message})",
                )
            # A refused request was not applied, so retrying it is safe even when it is not idempotent.
            return Step(wait.seconds, f"{wait.kind} rate limit", rate_limited=True)
        if not is_transient(status):
            return Step(None, message, infra=False)
    if not idempotent:
        return Step(None, f"{message} (not retried: it may have been applied)")
    if faults + 1 >= policy.attempts:
        return Step(None, f"{message} (gave up after {faults + 1} attempts)")
    return Step(backoff_delay(faults, policy, rng), message)


def _seconds(value: object) -> float | None:
    if value is None:
        return None
    try:
        number = float(str(value).strip())
    except ValueError:
        return None
    return number if number == number and number >= 0 else None  # NaN and negatives mean nothing here
