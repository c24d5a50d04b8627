"""The PR template: the "Tested" box, the contributor's before/after table, and the gain they claim.

A PR is evaluated once its description shows the contributor's own measurement: the Tested box ticked
and at least one table row with numbers that gain. Otherwise it is labelled needs-benchmark with a
comment saying what is missing and how to measure (and, with ``policy.template.require_benchmark``, it
waits). The parsed claim is kept so the report can show it beside the measured gain, and
``claim_gap`` flags a claim far above the measurement for a maintainer's look.

Parsing is forgiving and never raises on a description: HTML comments and fenced code are ignored
(the template's hints live there), header cells are matched by words (base/before/main,
head/after/branch, change/gain, context/ctx, model), and a cell that holds no number (empty, TBD, xx,
?) is a placeholder. Gains are fractions throughout: 0.051 is +5.1%.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from evalbot.model import Prose, PullRequest
from evalbot.policy.decision import Action, PolicyDecision
from evalbot.rules import Profile, Rules

BENCH_RUNS = 5  # runs per command: the engine reports their median

_TESTED = re.compile(r"\b(tested|ran the benchmark|benchmarked)\b", re.IGNORECASE)
_CHECKBOX = re.compile(r"^\s*[-*+]\s+\[([ xX])\]\s+(.*)$")
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
_HTML_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)
_SEPARATOR_CELL = re.compile(r":?-+:?")
_NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?")
_PERCENT = re.compile(r"(?<![\w.])([+-]?\d+(?:\.\d+)?)\s*%")
_TIMES = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*[x×](?!\w)")
_CONTEXT = re.compile(r"(?<![\w.])(\d+)\s*([kK])?\b")
_GAIN_WORDS = re.compile(r"\b(gain|gains|faster|speed-?up|improvement|improves?|claimed?)\b", re.IGNORECASE)
# Tried in this order: "change (head vs base)" is the change column, not the head or base one.
_COLUMNS = (
    ("change", re.compile(r"\b(change|gain|delta|speed-?up|diff)\b", re.IGNORECASE)),
    ("context", re.compile(r"\b(context|ctx|prompt)\b", re.IGNORECASE)),
    ("model", re.compile(r"\bmodel\b", re.IGNORECASE)),
    ("base", re.compile(r"\b(base|before|main|old)\b", re.IGNORECASE)),
    ("head", re.compile(r"\b(head|after|branch|pr|new)\b", re.IGNORECASE)),
)


@dataclass(frozen=True)
class BenchRow:
    """One row of the contributor's table; numbers are None where the cell holds none."""

    model: str
    context: int | None
    base_tps: float | None
    head_tps: float | None
    change: float | None  # as written in the change column

    @property
    def gain(self) -> float | None:
        """head/base - 1 from the throughputs, else the change column; None when the row has neither."""
        if self.base_tps and self.head_tps:
            return self.head_tps / self.base_tps - 1
        return self.change


@dataclass(frozen=True)
class TemplateFacts:
    """What the description says: the Tested box (None: absent), the table, and any stated gain."""

    tested: bool | None
    table_found: bool
    rows: tuple[BenchRow, ...]
    placeholders: tuple[str, ...]  # base/head cells that hold no number, as written ("" for empty)
    stated_gain: float | None  # a "+5.1% faster"-style claim outside the table
    unread_table: str | None = None  # the header of a table that is not a before/after one, where no other is

    @property
    def filled_rows(self) -> tuple[BenchRow, ...]:
        """The rows that carry a gain."""
        return tuple(r for r in self.rows if r.gain is not None)

    @property
    def claimed_gain(self) -> float | None:
        """The best gain in the table, else the stated one; None when the description claims nothing."""
        gains = [r.gain for r in self.filled_rows if r.gain is not None]
        return max(gains) if gains else self.stated_gain

    def claimed_gain_at(self, context: int | None) -> float | None:
        """The claimed gain at one context (the best over models), else the overall claim."""
        gains = [r.gain for r in self.filled_rows if r.gain is not None and r.context == context]
        return max(gains) if gains else self.claimed_gain


@dataclass(frozen=True)
class ClaimGap:
    """The claimed gain against the measured one; flagged when the claim is far above it."""

    claimed: float | None
    measured_lower: float | None
    measured_point: float | None
    gap: float | None  # claimed - measured_point
    flagged: bool
    reason: str
    label: str | None  # the claim-gap label when flagged


# ---------------------------------------------------------------- parsing


def parse_body(body: str | None) -> TemplateFacts:
    """Read the Tested box, the before/after table and a stated gain from a PR description."""
    lines = _visible_lines(body or "")
    tested = None
    for line in lines:
        m = _CHECKBOX.match(line)
        if m and _TESTED.search(m.group(2)):
            tested = m.group(1) in "xX"
            break
    table = _find_table(lines)
    rows: list[BenchRow] = []
    placeholders: list[str] = []
    if table is not None:
        columns, body_rows = table
        for cells in body_rows:
            row, empty = _row(columns, cells)
            rows.append(row)
            placeholders.extend(empty)
    return TemplateFacts(
        tested=tested,
        table_found=table is not None,
        rows=tuple(rows),
        placeholders=tuple(placeholders),
        stated_gain=_stated_gain(lines),
        unread_table=None if table is not None else _first_header(lines),
    )


def _visible_lines(body: str) -> list[str]:
    """The description's lines without HTML comments and fenced code, where hints and logs live."""
    text = _HTML_COMMENT.sub("", body.replace("\r\n", "\n").replace("\r", "\n"))
    out, fence = [], None
    for line in text.split("\n"):
        m = _FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * 3
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif fence is None:
            out.append(line)
    return out


def _cells(line: str) -> list[str]:
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return [c.strip() for c in re.split(r"(?<!\\)\|", inner)]


def _is_separator(line: str) -> bool:
    """A table's |---|:--:| line, checked cell by cell (a single regex over the line backtracked
    quadratically on long runs of spaces: 16 s for 32k of them)."""
    inner = line.strip()
    if not inner or "-" not in inner:
        return False
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") else inner
    return all(_SEPARATOR_CELL.fullmatch(cell.strip()) for cell in inner.split("|"))


def _tables(lines: list[str]) -> list[tuple[list[str], list[list[str]]]]:
    """Every markdown table: its header cells and its rows' cells."""
    out = []
    for i in range(len(lines) - 1):
        if "|" not in lines[i] or not _is_separator(lines[i + 1]):
            continue
        rows = []
        for line in lines[i + 2 :]:
            if "|" not in line or not line.strip():
                break
            rows.append(_cells(line))
        out.append((_cells(lines[i]), rows))
    return out


def _kind(cell: str) -> str | None:
    """Which of the _COLUMNS a header (or first) cell names."""
    return next((name for name, pattern in _COLUMNS if pattern.search(cell)), None)


def _find_table(lines: list[str]) -> tuple[dict[str, int], list[list[str]]] | None:
    """The first before/after table, as column indexes and rows: a column per side (the header names base
    and head, or change, columns), or a row per side (the first cells name base and head rows; each other
    column is then one context, named in its header), read as if turned a quarter."""
    for header, rows in _tables(lines):
        columns: dict[str, int] = {}
        for index, cell in enumerate(header):
            kind = _kind(cell)
            if kind is not None:
                columns.setdefault(kind, index)
        if {"base", "head"} <= columns.keys() or "change" in columns:
            return columns, rows
        by_side: dict[str, list[str]] = {}
        for row in rows:
            kind = _kind(row[0]) if row else None
            if kind in ("base", "head", "change"):
                by_side.setdefault(kind, row)
        if {"base", "head"} <= by_side.keys():
            turned = [
                [header[j], *(by_side[k][j] if j < len(by_side[k]) else "" for k in ("base", "head")),
                 by_side["change"][j] if "change" in by_side and j < len(by_side["change"]) else ""]
                for j in range(1, len(header))
            ]  # fmt: skip
            return {"context": 0, "base": 1, "head": 2, "change": 3}, turned
    return None


def _first_header(lines: list[str]) -> str | None:
    """The first table's header line, as written again from its cells (None: no table)."""
    tables = _tables(lines)
    return ("| " + " | ".join(tables[0][0]) + " |")[:200] if tables else None


def _row(columns: dict[str, int], cells: list[str]) -> tuple[BenchRow, list[str]]:
    def cell(name: str) -> str:
        index = columns.get(name)
        return cells[index] if index is not None and index < len(cells) else ""

    base, head = _throughput(cell("base")), _throughput(cell("head"))
    empty = [_plain(cell(n)) for n, v in (("base", base), ("head", head)) if n in columns and v is None]
    context_match = _CONTEXT.search(_plain(cell("context")))
    context = None
    if context_match:
        context = int(context_match.group(1)) * (1024 if context_match.group(2) else 1)
    row = BenchRow(_plain(cell("model")), context, base, head, _change(cell("change")))
    return row, empty


def _plain(cell: str) -> str:
    """A cell without markdown emphasis or code marks, with a real minus sign."""
    return cell.replace("**", "").replace("__", "").replace("`", "").replace("\u2212", "-").strip()


_UNITS = ("tokens/s", "tok/s", "t/s", "tps")


def _throughput(cell: str) -> float | None:
    text = _plain(cell)
    lowered = text.lower()
    unit = next((u for u in _UNITS if lowered.endswith(u)), "")
    text = text[: len(text) - len(unit)].strip().replace(",", "")
    if not _NUMBER.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) and value > 0 else None


def _change(cell: str) -> float | None:
    text = _plain(cell)
    m = _PERCENT.search(text)
    if m:
        return float(m.group(1)) / 100
    m = _TIMES.search(text)
    if m and float(m.group(1)) > 0:
        return float(m.group(1)) - 1
    return None


def _stated_gain(lines: list[str]) -> float | None:
    for line in lines:
        if "|" in line or not _GAIN_WORDS.search(line):
            continue
        m = _PERCENT.search(_plain(line))
        if m:
            return float(m.group(1)) / 100
    return None


# ---------------------------------------------------------------- the rule


def bench_profile(rules: Rules) -> Profile:
    """The profile contributors can reproduce at home: the first CPU one, else the first."""
    return next((p for p in rules.profiles if p.device == "cpu"), rules.profiles[0])


def bench_commands(rules: Rules) -> tuple[str, ...]:
    """The local commands, one per scored context, whose decode_tps fill the table (main, then branch)."""
    profile = bench_profile(rules)
    model = next((m for m in profile.models if m.has_weights), profile.models[0])
    engine = rules.engine  # engine.yaml: the contest's own model arguments and bench command
    args = (
        engine.model_args(model=model.path or model.name)
        if model.has_weights
        else engine.model_args(shape=model.name)
    )
    what = " ".join(args)
    return tuple(
        engine.bench.format_map({"model_args": what, "ctx": ctx, "runs": BENCH_RUNS})
        for ctx in profile.scored_contexts
    )


def template_table(rules: Rules) -> tuple[str, tuple[int, ...]]:
    """The PR template table's model and contexts: the bench profile's, one row per scored context."""
    profile = bench_profile(rules)
    model = next((m for m in profile.models if m.has_weights), profile.models[0])
    return model.name, tuple(profile.scored_contexts)


def problem(facts: TemplateFacts) -> str | None:
    """What keeps the description from counting as a local measurement; None when it does."""
    if facts.tested is None and not facts.table_found:
        return (
            "the description does not follow the pull request template: it has no Tested box and no "
            "before/after table"
        )
    if facts.tested is None:
        return "the description has no Tested box"
    if not facts.tested:
        return "the Tested box is not ticked"
    if not facts.table_found and facts.unread_table is not None:
        return (
            f"its table ({facts.unread_table}) is not a before/after table: it needs a column per side "
            "(main, base or before; PR, head or after) or a row per side, with the tok/s of each"
        )
    if not facts.table_found:
        return "the description has no before/after table"
    if not facts.filled_rows:
        shown = sorted({p or "empty" for p in facts.placeholders})
        found = f" (found: {', '.join(shown[:6])})" if shown else ""
        return f"the before/after table holds no numbers{found}"
    best = facts.claimed_gain
    if best is not None and best <= 0:
        return f"your own numbers show no gain (best {_pct(best)})"
    return None


def check(pr: PullRequest, rules: Rules, facts: TemplateFacts | None = None) -> PolicyDecision | None:
    """NEEDS_BENCHMARK when the description lacks a ticked Tested box and a table that gains; else None.
    `facts` is the body already parsed (intake parses each body once)."""
    facts = facts if facts is not None else parse_body(pr.body)
    why = problem(facts)
    if why is None:
        return None
    required = rules.policy.template.require_benchmark
    comment = Prose.of("benchmark_needed", why=why, commands=bench_commands(rules), required=required)
    return PolicyDecision(
        "template",
        Action.NEEDS_BENCHMARK,
        not required,
        f"needs a local benchmark: {why}",
        labels_add=(rules.labels.needs_benchmark,),
        comment=comment,
    )


def claim_gap(
    claimed: float | None, measured_lower: float | None, measured_point: float | None, rules: Rules
) -> ClaimGap:
    """Compare a claimed gain with the measured one (fractions); flagged when it exceeds it by more
    than ``policy.template.claim_gap_max``. A modest claim below the measurement is never flagged."""
    limit = rules.policy.template.claim_gap_max
    if claimed is None or measured_point is None:
        missing = "no claimed gain" if claimed is None else "no measured gain"
        return ClaimGap(claimed, measured_lower, measured_point, None, False, f"{missing} to compare", None)
    gap = claimed - measured_point
    measured = _pct(measured_point)
    if measured_lower is not None:
        measured += f" (95% CI lower bound {_pct(measured_lower)})"
    if gap > limit:
        reason = (
            f"claimed {_pct(claimed)}, measured {measured}: {gap * 100:.1f} points above the measurement, "
            f"more than the {limit * 100:.1f} allowed; a maintainer should look"
        )
        return ClaimGap(claimed, measured_lower, measured_point, gap, True, reason, rules.labels.claim_gap)
    reason = f"claimed {_pct(claimed)}, measured {measured}: within {limit * 100:.1f} points"
    return ClaimGap(claimed, measured_lower, measured_point, gap, False, reason, None)


def _pct(fraction: float) -> str:
    return f"{fraction * 100:+.1f}%"
