"""The PR comment: one markdown report rendered from a Verdict and its Measurements (jinja2).

Every string that a contributor can influence (title, branch, login, failure messages, log tails,
reasons that quote them) reaches the markdown only through ``escape_md`` or ``fenced``, so a PR
cannot inject markdown, HTML, mentions or issue cross-references into the bot's own comment.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import jinja2

from evalbot import times
from evalbot.codec import from_dict
from evalbot.markdown import escape_md, visible
from evalbot.model import Gate, GateKind, Measurements, Prose, Status, Verdict
from evalbot.stats import MDE_POWER

MARKER = "<!-- evalbot:result -->"
STATE_SCHEMA = 2
COMMENT_MAX_CHARS = 65536  # GitHub refuses (422) a longer issue comment
_TRIMMED_NOTE = (
    "\n\n> **Trimmed:** this comment was cut to fit GitHub's {limit:,}-character limit; "
    "`result.json` and the signed receipt hold everything.\n"
)

# Base64 has no '-' or '>', so no value in the state can close the HTML comment early.
_STATE_RE = re.compile(r"<!-- evalbot:state ([A-Za-z0-9+/=]*) -->")
_TEMPLATES = Path(__file__).parent / "templates"

# A comment may hold 65536 characters; these caps keep a pathological PR well inside that.
_MAX_FAILURES = 8
_LOG_LINES = 40
_LOG_CHARS = 3000

_STATUS_ICON = {
    Status.PASS: "✅",
    Status.REJECT: "❌",
    Status.INFRA_ERROR: "⚠️",
    Status.INCONCLUSIVE: "🔁",
    Status.SKIPPED: "⏭️",
}
_METRIC_NAMES = {
    "decode_tps": "decode tok/s",
    "decode_cpu_tps": "decode tok/CPU-s",
    "prefill_tps": "prefill tok/s",
    "decode_utilization": "CPU s per wall s",
}


# --- escaping (evalbot.markdown) -----------------------------------------------------------------


def fenced(text: str, info: str = "text", max_lines: int | None = None, max_chars: int | None = None) -> str:
    """A fenced code block holding text verbatim; the fence is longer than any backtick run inside."""
    body = visible(str(text).replace("\r\n", "\n").replace("\r", "\n"), keep="\n\t").strip("\n")
    lines = body.split("\n")
    omitted = 0
    if max_lines is not None and len(lines) > max_lines:
        omitted, lines = len(lines) - max_lines, lines[-max_lines:]
    if max_chars is not None:
        while len(lines) > 1 and sum(len(line) + 1 for line in lines) > max_chars:
            omitted, lines = omitted + 1, lines[1:]
        if len(lines[0]) > max_chars:
            lines[0] = "…" + lines[0][-max_chars:]
    if omitted:
        lines.insert(0, f"[… {omitted} earlier line{'s' if omitted != 1 else ''} omitted]")
    body = "\n".join(lines)
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{body}\n{fence}"


# --- numbers -------------------------------------------------------------------------------------


def _pct_digits(*fractions: float) -> int:
    # One decimal place hides sub-percent effects ("+0.0%"); show two while every value is below 1%.
    return 2 if all(abs(f) * 100 < 0.95 for f in fractions) else 1


def _pct(fraction: float, digits: int | None = None) -> str:
    """A signed percentage from a fraction: 0.047 -> "+4.7%"."""
    if not math.isfinite(fraction):
        return "n/a"
    text = f"{fraction * 100:+.{_pct_digits(fraction) if digits is None else digits}f}%"
    return text[1:] if text.strip("+-0.%") == "" else text  # no sign on an exact zero


def _delta(ratio: float) -> str:
    return _pct(ratio - 1.0)


def _ratio(ratio: float) -> str:
    return f"{ratio:.3f}×" if math.isfinite(ratio) else "n/a"


def _ci(low: float, high: float) -> str:
    digits = _pct_digits(low - 1.0, high - 1.0)
    return f"[{_pct(low - 1.0, digits)}, {_pct(high - 1.0, digits)}]"


def _share(fraction: float) -> str:
    """An unsigned percentage, e.g. an MDE: 0.024 -> "2.4%"."""
    return f"{fraction * 100:.{_pct_digits(fraction)}f}%" if math.isfinite(fraction) else "n/a"


def _num(value: float | None) -> str:
    if value is None:
        return "—"
    if not math.isfinite(value):
        return "n/a"
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.1f}"
    if magnitude >= 10:
        return f"{value:.2f}"
    if magnitude >= 0.01:
        return f"{value:.3f}"
    return f"{value:.2g}"


def _sha(value: str, length: int = 12) -> str:
    # Hex is shown as code; anything else is not what we expect, so it is treated as untrusted text.
    if re.fullmatch(r"[0-9a-fA-F]{7,64}", value or ""):
        return f"`{value[:length]}`"
    return escape_md(value or None, 80)


def _geomean_ratio(pairs: Iterable[tuple[float, float]]) -> float | None:
    logs = [math.log(h / b) for b, h in pairs if b > 0 and h > 0 and math.isfinite(b) and math.isfinite(h)]
    return math.exp(sum(logs) / len(logs)) if logs else None


# --- state ---------------------------------------------------------------------------------------


def comment_state(verdict: Verdict, measurements: Measurements, *, signature_status: str) -> dict[str, Any]:
    """The JSON state embedded in the comment: only what the bot needs to find its own verdict again
    (revisions, keys, status, tier), never the verdict's text, which a PR can make arbitrarily long."""
    p = measurements.provenance
    return {
        "schema": STATE_SCHEMA,
        "repo": p.repo[:200],
        "pr": p.pr,
        "base_sha": p.base_sha,
        "head_sha": p.head_sha,
        "measured_sha": p.measured_sha,
        "harness_sha": p.harness_sha,
        "rules_hash": p.rules_hash,
        "signature_status": signature_status[:120],
        "status": verdict.status.value,
        "tier": verdict.tier,
        "scored_context": verdict.scored_context,
    }


def _encode_state(state: dict[str, Any]) -> str:
    data = json.dumps(state, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return base64.b64encode(data.encode()).decode("ascii")


def find_state(comment_body: str) -> dict[str, Any] | None:
    """The state embedded by render_comment, or None if absent or unreadable.

    Anyone can write this marker in their own comment: only trust it in a comment the bot authored.
    """
    match = _STATE_RE.search(comment_body or "")
    if match is None:
        return None
    try:
        state = json.loads(base64.b64decode(match.group(1), validate=True).decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return state if isinstance(state, dict) else None


# --- rendering -----------------------------------------------------------------------------------


def _make_environment(folder: Path, *, html: bool, **filters: Any) -> jinja2.Environment:
    """A strict Jinja environment over one template folder, with the shared number filters and `ci`."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder),
        autoescape=html,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=not html,
    )
    env.filters.update(pct=_pct, delta=_delta, ratio=_ratio, share=_share, num=_num, **filters)
    env.globals["ci"] = _ci
    return env


@functools.cache
def _environment() -> jinja2.Environment:
    # Markdown, not HTML: autoescape would mangle it. Untrusted fields go through the md filter instead.
    return _make_environment(
        _TEMPLATES,
        html=False,
        md=escape_md,
        fenced=fenced,
        sha=_sha,
        metric=lambda name: _METRIC_NAMES.get(name) or escape_md(name),
    )


def _gates_at(gates: Iterable[Gate], model: str, context: int | None) -> list[Gate]:
    return [g for g in gates if g.context == context and g.model in (None, model)]


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(i for i in items if i))


def _context(verdict: Verdict, measurements: Measurements, signature_status: str) -> dict[str, Any]:
    gates = verdict.gates
    rows = []
    for e in verdict.estimates:
        failing = [g for g in _gates_at(gates, e.model, e.context) if not g.passed]
        rows.append({"e": e, "failing": failing})
    accuracy = [
        {"a": a, "gates": [g for g in gates if g.kind is GateKind.ACCURACY and g.model in (None, a.model)]}
        for a in measurements.accuracy
    ]
    spec = [
        {
            "s": s,
            "gates": [
                g
                for g in gates
                if g.kind is GateKind.SPEC and g.model in (None, s.target) and g.context in (None, s.context)
            ],  # a row's own context: each is measured apart
            "ar_ratio": _geomean_ratio(s.ar_pairs),
            "spec_ratio": _geomean_ratio(s.spec_pairs),
        }
        for s in measurements.spec
    ]
    regressed = {e.model for e in verdict.estimates if e.regression}
    scores = [
        {"s": sc, "e": sc.estimate,
         "tier": "✗ regression" if sc.model in regressed and sc.metric == "decode" else _score_tier(sc, verdict.status)}
        for sc in verdict.scores
    ]  # fmt: skip
    scored_mdes = [e.mde for e in verdict.estimates if e.scored]
    mde = verdict.mde if verdict.mde is not None else max(scored_mdes, default=None)
    reasons = _unique([*verdict.reasons, measurements.skipped_reason or ""])
    return {
        "marker": MARKER,
        "state": _encode_state(comment_state(verdict, measurements, signature_status=signature_status)),
        "v": verdict,
        "m": measurements,
        "p": measurements.provenance,
        "status": verdict.status.value,
        "icon": _STATUS_ICON[verdict.status],
        "headline": verdict.headline,
        "reasons": reasons,
        "rows": rows,
        "scores": scores,
        "box": box_name(measurements.provenance.box),
        "failed_gates": [g for g in gates if not g.passed],
        "accuracy": accuracy,
        "spec": spec,
        "audits": measurements.audits,
        # (model, context) whose decode agreement failed: the audit table marks the PR's row there (a rare
        # flip past a near-tie within the rules' max_gap is listed, not failed)
        "audit_failed": {
            (g.model, g.context) for g in gates if g.name == "decode agreement" and not g.passed
        },
        "failures": measurements.failures[:_MAX_FAILURES],
        "failures_omitted": max(len(measurements.failures) - _MAX_FAILURES, 0),
        "log_lines": _LOG_LINES,
        "log_chars": _LOG_CHARS,
        "mde": mde,
        "mde_power": MDE_POWER,
        "signature_status": signature_status,
        "box_during": box_summary(measurements.box_samples),
    }


def _score_tier(score: Any, status: Status) -> str:
    """A score's tier as the headline shows it: earned only on a PASS (a REJECT withholds every tier)."""
    if score.estimate is None:
        return "not measured"
    if status is not Status.PASS:
        return f"— ({score.tier} withheld)" if score.tier else "—"
    return f"**{score.tier}**" if score.tier else "none"


def box_name(box: dict[str, Any]) -> str:
    """The box in a few words: its GPU where it has one, else its CPU and cores."""
    gpu, cpu, cores = box.get("gpu"), box.get("cpu"), box.get("cores")
    if gpu:
        return str(gpu)
    if cpu:
        return f"{cpu}" + (f", {cores} cores" if isinstance(cores, int) else "")
    return ""


def box_summary(samples: tuple[dict[str, Any], ...]) -> str:
    """One line on the box's state across the A/B pairs: CPU load, cores other processes used before and
    during the pairs, seconds waited for quiet, GPU utilization, clock and temperature (ranges)."""
    if not samples:
        return ""
    parts = [f"{len(samples)} samples"]
    for key, label, unit in (
        ("load1", "load", ""),
        ("other_cores", "others' CPU before pairs", " cores"),
        ("during_other_cores", "during pairs", " cores"),
        ("waited_s", "waited for quiet", " s"),
        ("gpu_util", "GPU busy before pairs", "%"),
        ("gpu_clock_sm", "GPU SM clock", ""),
        ("gpu_temp", "GPU", " °C"),
    ):
        read = [_leading_number(s.get(key)) for s in samples]
        values = [v for v in read if v is not None]
        if values:
            lo, hi = min(values), max(values)
            span = f"{lo:g}" if lo == hi else f"{lo:g}–{hi:g}"
            parts.append(f"{label} {span}{unit}")
    return ", ".join(parts)


def _leading_number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value.split():
        try:
            return float(value.split()[0])
        except ValueError:
            return None
    return None


def fit_comment(body: str, limit: int = COMMENT_MAX_CHARS) -> str:
    """body, or its longest line-aligned prefix that fits limit with a note saying it was trimmed.
    Code fences and <details> left open by the cut are closed, so the rest still renders."""
    if len(body) <= limit:
        return body
    note = _TRIMMED_NOTE.format(limit=limit)
    budget = limit - len(note) - 64  # room for the closers
    cut = body.rfind("\n", 0, budget)
    head = body[: cut if cut > 0 else budget]
    closers = []
    fence = None
    for line in head.split("\n"):
        stripped = line.strip()
        if fence is None and stripped.startswith(("```", "~~~")):
            fence = stripped[: len(stripped) - len(stripped.lstrip(stripped[0]))]
        elif fence is not None and stripped.startswith(fence) and stripped.strip(fence[0]) == "":
            fence = None
    if fence is not None:
        closers.append(fence)
    open_details = head.count("<details>") - head.count("</details>")
    closers += ["</details>"] * max(open_details, 0)
    return head + ("\n" + "\n".join(closers) if closers else "") + note


class Standing(NamedTuple):
    """Where a measured PR stands beyond its numbers, shown under its verdict (plain text, escaped here)."""

    claim: str = ""  # the contributor's claim against the measurement
    claim_flagged: bool = False  # a gap worth a maintainer's look
    approval: str = ""  # why it needs a maintainer before it merges
    round: str = ""  # its place in the round
    stopped: str = ""  # why intake does not measure it again
    merge: str = ""  # why a PASS does not merge itself (auto-merge off)


def render_comment(
    verdict: Verdict, measurements: Measurements, *, signature_status: str, standing: Standing | None = None
) -> str:
    """The PR comment (markdown) for one evaluation, with the hidden marker and embedded state."""
    template = _environment().get_template("comment.md.j2")
    return template.render(
        _context(verdict, measurements, signature_status) | {"standing": standing or Standing()}
    )


def render_notice(
    *, pr: int, head_sha: str, title: str, lines: Iterable[str], kind: str, author: str = ""
) -> str:
    """The PR comment for a decision that is not a measured verdict (policy, copycat, rounds), with the marker.

    `lines` are plain text, escaped here; `kind` names the decision in the embedded state.
    """
    state = {"schema": STATE_SCHEMA, "pr": pr, "head_sha": head_sha, "notice": kind}
    template = _environment().get_template("notice.md.j2")
    return template.render(marker=MARKER, state=_encode_state(state), title=title, pr=pr, head_sha=head_sha,
                           author=author, lines=list(lines))  # fmt: skip


def render_pr_template(
    commands: Iterable[str], model: str, contexts: Iterable[int], paths: Iterable[str]
) -> str:
    """The repository's PR template: the local benchmark commands, the before/after table the bot reads
    (a row per scored context), and the paths a PR must leave alone; all from the rules."""
    template = _environment().get_template("pull_request_template.md.j2")
    return template.render(commands=list(commands), model=model, contexts=list(contexts),
                           paths=[f"`{p}`" for p in paths])  # fmt: skip


def render_prose(prose: Iterable[Prose]) -> str:
    """The rules' prose for a PR (markdown), each from its template under ``templates/notices/``, in order."""
    env = _environment()
    return "\n\n".join(
        env.get_template(f"notices/{p.template}.md.j2").render(dict(p.data)).strip() for p in prose
    )


def render_verdict_file(path: str | os.PathLike[str]) -> str:
    """The comment for a result.json ({"measurements", "verdict", "signature_status"?}), for previews."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or "measurements" not in data or "verdict" not in data:
        raise ValueError(f"{path}: expected an object with 'measurements' and 'verdict'")
    return render_comment(
        from_dict(Verdict, data["verdict"]),
        from_dict(Measurements, data["measurements"]),
        signature_status=str(data.get("signature_status", "unsigned")),
    )


__all__ = [
    "MARKER",
    "comment_state",
    "escape_md",
    "fenced",
    "find_state",
    "render_comment",
    "render_notice",
    "render_verdict_file",
]


# --- the dashboard (HTML) ------------------------------------------------------------------------
# A separate environment: HTML autoescaping is on, so every value (a PR title, a login, a reason) is
# escaped where it lands. Nothing a contributor wrote is ever marked safe; filters return plain str.

_SITE_TEMPLATES = _TEMPLATES / "site"
_HEX_RE = re.compile(r"[0-9a-fA-F]{7,64}")


def _site_text(value: Any, limit: int | None = None) -> str:
    """Untrusted text as one visible line (controls, ANSI and bidi overrides dropped), cut past limit."""
    if value is None or value == "":
        return "—"
    flat = " ".join(visible(" ".join(str(value).split())).split())
    if limit is not None and len(flat) > limit:
        flat = flat[: max(limit - 1, 0)].rstrip() + "…"
    return flat


def _site_sha(value: Any, length: int = 12) -> str:
    text = str(value or "")
    return text[:length] if _HEX_RE.fullmatch(text) else _site_text(text, 24)


def site_time(value: Any) -> str:
    """A store time (ISO text or datetime) as "2026-11-30 10:00 UTC"; unreadable text is shown as text."""
    from datetime import UTC, datetime

    if isinstance(value, datetime):
        moment = value
    else:
        try:
            moment = times.parse(str(value).strip(), naive_is_utc=True)
        except ValueError:
            return _site_text(value, 40)
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


@functools.cache
def _site_environment() -> jinja2.Environment:
    return _make_environment(
        _SITE_TEMPLATES,
        html=True,
        text=_site_text,
        sha=_site_sha,
        when=site_time,
        metric=lambda name: _METRIC_NAMES.get(name) or _site_text(name, 30),
    )


def render_site_page(template: str, context: dict[str, Any]) -> str:
    """One dashboard page (HTML, autoescaped) from a template in templates/site/."""
    return _site_environment().get_template(template).render(context)


def site_stylesheet() -> str:
    """The dashboard's CSS."""
    return (_SITE_TEMPLATES / "style.css").read_text(encoding="utf-8")
