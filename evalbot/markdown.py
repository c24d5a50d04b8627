"""Untrusted text made inert for GitHub markdown: pure functions, no templates, no I/O.

Policy and verdict code write one-line notes about PR-controlled text (titles, paths, logins); they
escape it here, so that no pure module needs the renderer. `render` uses the same functions.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

_ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]")
# Bidi overrides and isolates can make escaped text read as something else ("Trojan source").
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
# A zero-width space as an entity: it survives editors and diffs, and GitHub decodes it before it
# looks for @mentions, #refs and bare URLs, which it then no longer finds.
_ZWSP = "&#8203;"
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# Inline markdown (emphasis, code, links, tables, strikethrough, math) and '#' (headings, refs).
_BACKSLASHED = frozenset("\\`*_[]|~$#")
_TOKEN_RE = re.compile(
    r"(?P<scheme>(?i:https?|ftp)(?=://))|(?P<www>(?i:www)(?=\.))|(?P<gh>(?i:gh)(?=-\d))|(?P<ch>.)",
    re.DOTALL,
)
# Block syntax that only counts at the start of a line: lists, thematic breaks, setext underlines.
_LINE_START_RE = re.compile(r"^(?:[-+](?=[ \t]|$)|[-=][-= \t]*$|(\d{1,9})([.)])(?=[ \t]|$))")


def visible(text: str, keep: str = "") -> str:
    """Text without ANSI colour codes, bidi controls and control characters (other than those in keep)."""
    text = _ANSI_RE.sub("", text)
    return "".join(ch for ch in text if ch in keep or (ch not in _BIDI and unicodedata.category(ch) != "Cc"))


def escape_md(text: Any, limit: int | None = None) -> str:
    """Untrusted text as one inert line of GitHub markdown: no markup, HTML, mentions, refs or autolinks.

    Whitespace (newlines too) collapses to single spaces; past `limit` characters the text is cut with "…".
    """
    if text is None:
        return "—"
    flat = " ".join(visible(" ".join(str(text).split())).split())
    if limit is not None and len(flat) > limit:
        flat = flat[: max(limit - 1, 0)].rstrip() + "…"
    out = []
    for m in _TOKEN_RE.finditer(flat):
        if m.group("scheme") or m.group("www") or m.group("gh"):
            out.append(m.group(0) + _ZWSP)  # "https&#8203;://", "www&#8203;.", "GH&#8203;-1"
            continue
        ch = m.group("ch")
        if ch in _ENTITIES:
            out.append(_ENTITIES[ch])
        elif ch in _BACKSLASHED:
            out.append("\\" + ch)
        elif ch == "@":
            out.append("@" + _ZWSP)
        else:
            out.append(ch)
        if ch == "#" and flat[m.end() : m.end() + 1].isdigit():
            out.append(_ZWSP)  # "#12" would link, and cross-reference, issue 12
    escaped = "".join(out)
    # Only the first character can start a line: a table cell or a mid-line field never does.
    return _LINE_START_RE.sub(
        lambda m: f"{m.group(1)}\\{m.group(2)}" if m.group(1) else "\\" + m.group(0), escaped
    )
