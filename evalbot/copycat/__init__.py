"""Copycat detection: fingerprints of the code a PR adds, containment against earlier PRs, bands, strikes.

- ``fingerprint`` (pure): unidiff -> pygments tokens -> normalized stream -> winnowed k-gram hashes;
- ``containment`` (pure): who could have been copied, how much of a PR they hold, the band from the rules;
- ``strikes`` (pure): when copycat strikes blocklist an author and freeze their evaluations;
- ``index``: the same evidence from an inverted index in the store's copycat tables (``store.copycat``);
- ``port``: the ``Screen`` protocol, what the poller asks of a screen;
- ``screen``: what the poller runs before queueing an evaluation (index, check, band, strikes);
- ``scan``: the check over a folder of diffs, offline (`evalbot copycat scan`).

Code outside the package imports from here; the modules import each other by name.
"""

from __future__ import annotations

from evalbot.copycat.containment import Band, CopycatFinding, Evidence, PrMeta, assess, gather
from evalbot.copycat.fingerprint import PrPrint, fingerprint_pr, fingerprint_source
from evalbot.copycat.index import CopycatIndex, check
from evalbot.copycat.port import Screen
from evalbot.copycat.scan import ScanError, ScanRow, scan
from evalbot.copycat.screen import CopycatScreen
from evalbot.copycat.strikes import Standing, prior_warnings, standing

__all__ = [
    "Band",
    "CopycatFinding",
    "CopycatIndex",
    "CopycatScreen",
    "Evidence",
    "PrMeta",
    "PrPrint",
    "ScanError",
    "ScanRow",
    "Screen",
    "Standing",
    "assess",
    "check",
    "fingerprint_pr",
    "fingerprint_source",
    "gather",
    "prior_warnings",
    "scan",
    "standing",
]
