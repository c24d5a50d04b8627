"""`evalbot calibrate`'s results: one row per (box, profile, model, context) per calibration."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from evalbot.store.db import Db, _check_gain, _check_text, _dumps, _loads


@dataclass(frozen=True)
class Calibration:
    """One box's A/A calibration at one (model, context): how often main against main got a tier or a
    regression call, the effect it can resolve, and its pair-to-pair noise (see evalbot.calibrate)."""

    at: str  # ISO 8601 UTC, as iso() writes it
    box: str  # the runner's name (or host name)
    profile: str
    model: str
    context: int
    runs: int  # A/A evaluations that measured this context
    false_positive_rate: float  # fraction of those runs with a tier awarded or a regression called here
    mde: float  # median minimum detectable effect over the runs (0.01 = 1%)
    noise_cv: float  # pooled within-run SD of the per-pair ln(head/base): the ratio's CV
    details: dict[str, Any]


class Calibrations:
    """Runner calibrations."""

    def __init__(self, db: Db) -> None:
        self._db = db

    def record(self, c: Calibration) -> bool:
        """Store one calibration row; False if this (at, box, profile, model, context) is already stored."""
        if not isinstance(c, Calibration):
            raise TypeError(f"expected a Calibration, got {type(c).__name__}")
        for name in ("at", "box", "profile", "model"):
            _check_text(getattr(c, name), name)
        for name, least in (("context", 0), ("runs", 1)):
            value = getattr(c, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name}: expected an integer >= {least}, got {value!r}")
        numbers = []
        for name, high in (("false_positive_rate", 1.0), ("mde", math.inf), ("noise_cv", math.inf)):
            value = _check_gain(getattr(c, name), name)
            if value is None or not 0.0 <= value <= high:
                raise ValueError(f"{name}: expected a finite number in [0, {high}], got {getattr(c, name)!r}")
            numbers.append(value)
        if not isinstance(c.details, dict):
            raise ValueError(f"details: expected a dict, got {type(c.details).__name__}")
        blob = _dumps(c.details, "calibration details")
        with self._db.write() as conn:
            cur = conn.execute(
                "INSERT INTO calibrations (at, box, profile, model, context, runs, false_positive_rate, mde, "
                "noise_cv, details) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (c.at, c.box, c.profile, c.model, c.context, c.runs, *numbers, blob),
            )
            return cur.rowcount == 1

    def recorded(self, profile: str | None = None) -> list[Calibration]:
        """Calibration rows, oldest first, optionally of one profile."""
        rows = self._db.read(
            "SELECT at, box, profile, model, context, runs, false_positive_rate, mde, noise_cv, details "
            "FROM calibrations WHERE (? IS NULL OR profile = ?) ORDER BY julianday(at), id",
            (profile, profile),
        )
        out = []
        for r in rows:
            fields = dict(r)
            fields["details"] = _loads(r["details"], f"calibration of {r['box']} at {r['at']}")
            out.append(Calibration(**fields))
        return out
