"""The engine–bot protocol: every engine command prints exactly one JSON object on stdout.

Each record carries ``schema``, ``command``, ``engine``, ``model_sha256``, ``device``, ``config``
(the effective settings, so that a pinned setting is visible), ``timings`` and ``counts``, plus
command-specific fields. Human text goes to stderr.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any, TextIO

SCHEMA_VERSION = 1


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
    """Assemble one protocol record; refuses NaN or infinite numbers (they are not valid JSON)."""
    record: dict[str, Any] = {
        "schema": f"evalbot.engine.{command}/{SCHEMA_VERSION}",
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
    """Print the record as one JSON line on stdout."""
    out = stream or sys.stdout
    out.write(json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n")
    out.flush()


def _check_finite(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: non-finite number {value!r} in engine record")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_finite(v, f"{where}[{i}]")
