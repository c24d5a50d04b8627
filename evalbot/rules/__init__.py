"""The contest's rules: ``rules/*.yaml`` validated into frozen dataclasses.

This package is the only one that imports yaml (``reader`` and ``load``); ``schema`` holds the
dataclasses. Every error names the file, the line and the field, and
says what was expected, e.g. ``rules/gates.yaml:12: gates.accuracy.top1_min: expected a number in
[0, 1], got 'high'``. Lines come from the marks on the composed YAML node tree, so they point at the
offending key or value, not at the start of the file.

Dataclass fields mirror the YAML (``gates.accuracy.top1_min`` is ``rules.gates.accuracy.top1_min``),
except that tier labels join their ``Tier`` and each profile's models join their ``Profile``.
Every key is required: the defaults live in the shipped YAML, not here.
"""

from __future__ import annotations

from evalbot.rules.load import *  # noqa: F403
from evalbot.rules.schema import *  # noqa: F403
