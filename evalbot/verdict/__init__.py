"""The verdict on one evaluation and what publishing it means.

- ``decide`` (pure): gates and tiers -> `Verdict`, the clock that scores at each context, and the A/B's
  early stop (`no_pair_could_change`);
- ``gates`` (pure): the correctness gates `decide` reads (the decode audit, accuracy, speculative decoding);
- ``comment``: a measured verdict as one `Decision` for the publisher (the PR's comment, labels, status).

Code outside the package imports from here.
"""

from __future__ import annotations

from evalbot.verdict.comment import STATUS_STATE, measured_claim_gap, verdict_decision
from evalbot.verdict.decide import INFRA_STAGES, decide, no_pair_could_change, score_clocks
from evalbot.verdict.gates import audits_open
from evalbot.verdict.tracks import spec_estimates

__all__ = [
    "INFRA_STAGES",
    "STATUS_STATE",
    "audits_open",
    "decide",
    "measured_claim_gap",
    "no_pair_could_change",
    "score_clocks",
    "spec_estimates",
    "verdict_decision",
]
