"""Fingerprints of the code a PR adds: unidiff -> pygments tokens -> normalized stream -> winnowing.

Normalization maps every identifier to ``I`` and every literal to ``L`` and drops whitespace and
comments, so renaming, reformatting and re-commenting leave the stream unchanged. Keywords,
operators and punctuation keep their text: they are the shape of the code.

Winnowing with k-gram size ``k`` and window ``w`` selects, from every window of ``w`` consecutive
k-gram hashes, the smallest (the rightmost on ties). Guarantee: two streams that share a run of at
least ``t = w + k - 1`` normalized tokens share at least one fingerprint, because that run holds a
whole window, and equal windows select equal minima. Runs shorter than ``k`` are never matched.

Hashes are stable across processes and Python versions (blake2b token ids, a polynomial k-gram
hash modulo 2**61 - 1) because the index keeps them in SQLite.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import unidiff
from pygments.lexer import Lexer
from pygments.lexers import get_lexer_for_filename
from pygments.token import Comment, Keyword, Literal, Name, Punctuation, Text, Whitespace, _TokenType
from pygments.util import ClassNotFound

from evalbot.model import PullRequest

IDENT = "I"
LITERAL = "L"
_PRIME = (1 << 61) - 1
_BASE = 0x5BD1E995_3C6EF372 % _PRIME
_CLOSERS = frozenset(")]}")
_FALLBACK = re.compile(r"""[A-Za-z_]\w*|\d[\w.]*|"[^"\n]*"|'[^'\n]*'|\S""")


class Token(NamedTuple):
    """One normalized token and the index of the line it starts on."""

    text: str
    line: int


class Fingerprint(NamedTuple):
    """One winnowing pick: the k-gram's hash and where it starts."""

    hash: int
    position: int  # index of the k-gram's first token in the file's normalized added stream
    line: int  # line of the new file that token is on


@dataclass(frozen=True)
class FilePrint:
    """What one file of a PR adds, fingerprinted."""

    path: str
    code_lines: int  # added lines holding at least one normalized token (not blank, not comment-only)
    tokens: int  # normalized tokens of the added lines
    fingerprints: tuple[Fingerprint, ...]
    literal: frozenset[int]  # hashes of the added code lines, whitespace-stripped

    @functools.cached_property
    def hashes(self) -> frozenset[int]:
        """The fingerprint hashes, without positions."""
        return frozenset(f.hash for f in self.fingerprints)


@dataclass(frozen=True)
class PrPrint:
    """Every file's fingerprints for one PR."""

    files: tuple[FilePrint, ...]

    @functools.cached_property
    def code_lines(self) -> int:
        """Added code lines over all files."""
        return sum(f.code_lines for f in self.files)

    @functools.cached_property
    def tokens(self) -> int:
        """Normalized tokens over all files."""
        return sum(f.tokens for f in self.files)

    @functools.cached_property
    def hashes(self) -> frozenset[int]:
        """Fingerprint hashes over all files."""
        return frozenset().union(*(f.hashes for f in self.files))

    @functools.cached_property
    def literal(self) -> frozenset[int]:
        """Literal line hashes over all files."""
        return frozenset().union(*(f.literal for f in self.files))


def normalize(path: str, code: str) -> list[Token]:
    """The normalized token stream of source text, lexed by the file name's lexer (or a plain split)."""
    lines = code.splitlines()
    return _normalize_lines(path, lines, range(len(lines)))


def kgram_hashes(tokens: Sequence[str], k: int) -> list[int]:
    """Stable hash of every run of k consecutive tokens, in order; empty if fewer than k tokens."""
    if len(tokens) < k:
        return []
    ids = [_token_id(t) for t in tokens]
    top = pow(_BASE, k - 1, _PRIME)
    h = 0
    for x in ids[:k]:
        h = (h * _BASE + x) % _PRIME
    out = [h]
    for i in range(k, len(ids)):
        h = ((h - ids[i - k] * top) * _BASE + ids[i]) % _PRIME
        out.append(h)
    return out


def winnow(hashes: Sequence[int], w: int) -> list[tuple[int, int]]:
    """(hash, position) of the minimum of every window of w hashes, rightmost on ties, each pick once.

    A stream with fewer than w hashes is one window.
    """
    picks: list[tuple[int, int]] = []
    last = -1
    for start in range(max(1, len(hashes) - w + 1)):
        window = hashes[start : start + w]
        if not window:
            break
        low = min(window)
        pos = start + len(window) - 1 - window[::-1].index(low)
        if pos != last:
            picks.append((low, pos))
            last = pos
    return picks


def fingerprint_file(path: str, patch: str, k: int, w: int) -> FilePrint:
    """Fingerprints of the code one file's patch adds."""
    target = _target_lines(path, patch)
    added = [i for i, (_, _, is_added) in enumerate(target) if is_added]
    tokens = _normalize_lines(path, [t for _, t, _ in target], added)
    picks = winnow(kgram_hashes([t.text for t in tokens], k), w)
    code = sorted({t.line for t in tokens})
    return FilePrint(
        path=path,
        code_lines=len(code),
        tokens=len(tokens),
        fingerprints=tuple(Fingerprint(h, p, target[tokens[p].line][0]) for h, p in picks),
        literal=frozenset(line_hash(target[i][1]) for i in code),
    )


def fingerprint_pr(pr: PullRequest, k: int, w: int) -> PrPrint:
    """Fingerprints of every file a PR adds code to (removed files and empty patches add nothing)."""
    return PrPrint(tuple(fingerprint_file(f.path, f.patch, k, w) for f in pr.files if f.patch))


def fingerprint_source(path: str, text: str, k: int) -> frozenset[int]:
    """Every k-gram hash of a whole file, as main holds it (base code to exclude)."""
    return frozenset(kgram_hashes([t.text for t in normalize(path, text)], k))


def line_hash(text: str) -> int:
    """Stable hash of one line with surrounding whitespace stripped, for literal overlap."""
    return int.from_bytes(hashlib.blake2b(text.strip().encode(), digest_size=8).digest(), "big") >> 1


def _target_lines(path: str, patch: str) -> list[tuple[int, str, bool]]:
    """(line number in the new file, text, added?) for every new-side line of every hunk."""
    if not patch.strip():
        return []
    text = patch if patch.startswith("--- ") else f"--- a/{path}\n+++ b/{path}\n{patch}"
    if not text.endswith("\n"):
        text += "\n"
    out = []
    for patched in unidiff.PatchSet(text):
        for hunk in patched:
            for line in hunk:
                if line.is_added or line.is_context:
                    # added and context lines are on the new side: each has a new-file line number
                    assert line.target_line_no is not None
                    out.append((line.target_line_no, line.value.rstrip("\r\n"), line.is_added))
    return out


def _normalize_lines(path: str, lines: Sequence[str], keep: Iterable[int]) -> list[Token]:
    """Normalized tokens of the kept lines, lexed together with the others so strings and blocks parse."""
    keep = set(keep)
    if not keep:
        return []
    text = "".join(line + "\n" for line in lines)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    out: list[Token] = []
    for offset, kind, value in _lex(path, text):
        row = bisect.bisect_right(starts, offset) - 1
        if row not in keep:
            continue
        for piece in _normal(kind, value):
            if piece == LITERAL and out and out[-1].text == LITERAL:
                continue  # a string lexed in pieces (prefix, quotes, body) is one literal
            if piece in _CLOSERS and out and out[-1].text == ",":
                out.pop()  # formatters add and remove trailing commas at will
            out.append(Token(piece, row))
    return out


def _lex(path: str, text: str) -> Iterator[tuple[int, _TokenType, str]]:
    lexer = _lexer_for(_lexer_key(path))
    if lexer is None:
        for m in _FALLBACK.finditer(text):
            yield m.start(), _fallback_kind(m.group()), m.group()
        return
    yield from lexer.get_tokens_unprocessed(text)


def _fallback_kind(word: str) -> _TokenType:
    if word[0].isalpha() or word[0] == "_":
        return Name
    if word[0].isdigit() or word[0] in "\"'":
        return Literal
    return Punctuation


def _normal(kind: _TokenType, value: str) -> Iterator[str]:
    """The normalized pieces of one lexer token: none for whitespace and comments."""
    value = value.strip()
    if not value or kind in Whitespace:
        return
    if kind in Comment.PreprocFile or kind in Literal or kind in Keyword.Constant:
        yield LITERAL
    elif kind in Comment.Preproc:
        yield value
    elif kind in Comment:
        return
    elif kind in Name:
        yield IDENT
    elif kind in Text:
        # lexers leave what they do not understand as text; split it as an unknown language would
        for m in _FALLBACK.finditer(value):
            yield from _normal(_fallback_kind(m.group()), m.group())
    else:
        yield value


def _lexer_key(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    dot = name.rfind(".")
    return f"x{name[dot:]}" if dot > 0 else name


@functools.lru_cache(maxsize=256)
def _lexer_for(key: str) -> Lexer | None:
    # finding a lexer by name scans every registered pattern: once per extension is enough
    try:
        lexer = get_lexer_for_filename(key, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None
    return None if lexer.name == "Text only" else lexer


@functools.lru_cache(maxsize=4096)
def _token_id(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") % _PRIME
