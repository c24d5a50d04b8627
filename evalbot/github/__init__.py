"""GitHub for the bot: the GitHubPort protocol that the rest of evalbot programs against, and its adapter.

This package is the only one that imports PyGithub (``adapter`` alone does); ``port`` is the protocol
and its errors, ``facts`` turns GitHub's JSON into plain dataclasses, ``artifacts`` unpacks a run's
artifact zip safely. Everything crossing its boundary is a plain dataclass. Every
request goes through one loop that waits out rate limits and retries server faults, so an outage surfaces
as GitHubUnavailable (an infrastructure fault) and a refusal as GitHubError.
"""

from __future__ import annotations

from evalbot.github.adapter import *  # noqa: F403
from evalbot.github.artifacts import *  # noqa: F403
from evalbot.github.facts import *  # noqa: F403
from evalbot.github.port import *  # noqa: F403
