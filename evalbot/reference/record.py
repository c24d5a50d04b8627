"""The reference tools' records: one JSON object on stdout per command, in the layout of the engine
protocol's records (docs/protocol.md), so that a contest whose main brings its own reference tools
(engine.yaml `reference: main`) and evalbot's own are read alike."""

from __future__ import annotations

import json
import math
import sys
from typing import Any, TextIO


def make_record(
    command: str,
    *,
    engine: str,
    model_sha256: str,
    device: str,
    config: dict[str, Any],
    timings: dict[str, float],
    counts: dict[str, int],
    **fields: Any,
) -> dict[str, Any]:
    """One record; refuses NaN or infinite numbers (they are not valid JSON)."""
    record: dict[str, Any] = {
        "schema": f"evalbot.reference.{command}/1",
        "command": command,
        "engine": engine,
        "model_sha256": model_sha256,
        "device": device,
        "config": config,
        "timings": timings,
        "counts": counts,
        **fields,
    }
    _check_finite(record, command)
    return record


def emit(record: dict[str, Any], stream: TextIO | None = None) -> None:
    """The record as one JSON line on stdout."""
    out = stream or sys.stdout
    out.write(json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n")
    out.flush()


def _check_finite(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: non-finite number {value!r} in a reference record")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_finite(v, f"{where}[{i}]")
