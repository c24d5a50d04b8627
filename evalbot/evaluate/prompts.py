"""Benchmark prompts drawn from a versioned corpus of real text, with a fresh seed per evaluation.

The corpus is a flat directory of UTF-8 files (prose in several genres, code in several languages,
docs and config), identified by corpus_sha256. Each evaluation draws k windows of n_chars characters
with one seed, and gives base and head the same draws. A new seed for every evaluation means that a
PR cannot be tuned to one prompt. The receipt records (corpus sha256, seed, draws), which is enough to
reproduce the prompts exactly.

Versions are directories (``data/prompts/v1``). A published version is never edited: new text goes into a new
version, so an old receipt's corpus hash still names text that exists.
"""

from __future__ import annotations

import hashlib
import random
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# v1 is published and never edited (tests/evalbot/test_prompt_draws.py pins its hash); new text goes into v2.
CORPUS_V1 = Path(__file__).resolve().parent.parent / "data" / "prompts" / "v1"
SEPARATOR = "\n"  # between files in a window that runs past the end of one


@dataclass(frozen=True)
class Draw:
    """One prompt: the text from `offset` in file `name`, running on through `files` in that order."""

    name: str
    offset: int
    text: str
    files: tuple[str, ...] = ()


def corpus_files(corpus_dir: Path) -> list[Path]:
    """The corpus's files in name order: regular files directly in corpus_dir, dotfiles excluded."""
    return sorted(p for p in corpus_dir.iterdir() if p.is_file() and not p.name.startswith("."))


def corpus_sha256(corpus_dir: Path) -> str:
    """A hash of every corpus file's name and bytes, independent of file system order and timestamps."""
    h = hashlib.sha256()
    for path in corpus_files(corpus_dir):
        data = path.read_bytes()
        name = path.name.encode()
        # Length prefixes: moving bytes between a name and its content must change the hash.
        h.update(len(name).to_bytes(8, "big") + name + len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


def load_corpus(corpus_dir: Path) -> dict[str, str]:
    """Every corpus file's text by name; an empty corpus or an empty file is an error."""
    texts = {p.name: p.read_text(encoding="utf-8") for p in corpus_files(corpus_dir)}
    if not texts:
        raise ValueError(f"no corpus files in {corpus_dir}")
    empty = [name for name, text in texts.items() if not text]
    if empty:
        raise ValueError(f"empty corpus files in {corpus_dir}: {', '.join(empty)}")
    return texts


def draw_from(corpus: Mapping[str, str], seed: int, n_chars: int, k: int) -> list[Draw]:
    """k windows of exactly n_chars characters; random.Random(seed) picks each start file, offset and file order."""
    if n_chars <= 0 or k <= 0:
        raise ValueError(f"need positive n_chars and k, got n_chars={n_chars}, k={k}")
    names = sorted(corpus)  # the seed must mean the same draws however the mapping was built
    rng = random.Random(seed)
    draws = []
    for _ in range(k):
        # Start files are drawn uniformly, not by size, so that each genre is equally likely.
        first = rng.choice(names)
        offset = rng.randrange(len(corpus[first]))
        # A window that outruns its file continues into the other files, not into its own file again: a
        # repeated prompt flatters n-gram speculation and caching. Only one longer than the corpus wraps.
        rest = [n for n in names if n != first]
        rng.shuffle(rest)
        order = [first, *rest]
        lap = "".join(corpus[n] + SEPARATOR for n in order)
        repeats = -(-(offset + n_chars) // len(lap))
        text = (lap * repeats)[offset : offset + n_chars]
        draws.append(Draw(first, offset, text, _files_spanned(corpus, order, offset + n_chars)))
    return draws


def _files_spanned(corpus: Mapping[str, str], order: list[str], end: int) -> tuple[str, ...]:
    """The files of `order` that characters [0, end) of the lap reach into (all of them once it wraps)."""
    spanned, pos = [], 0
    for name in order:
        if pos >= end:
            break
        spanned.append(name)
        pos += len(corpus[name]) + len(SEPARATOR)
    return tuple(spanned)


def default_corpus_dir() -> Path:
    """The corpus version this bot draws from."""
    return CORPUS_V1


def draw(corpus_dir: Path, seed: int, n_chars: int, k: int) -> list[Draw]:
    """k prompts of n_chars characters from the corpus in corpus_dir; the same seed gives the same draws."""
    return draw_from(load_corpus(corpus_dir), seed, n_chars, k)


def write_prompt_files(draws: Sequence[Draw], out_dir: Path) -> list[Path]:
    """Write each draw's text to out_dir/prompt-NNN.txt (UTF-8, exact bytes) for `--prompt-file`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, d in enumerate(draws):
        path = out_dir / f"prompt-{i:03d}.txt"
        # newline="": write the text as drawn, with no newline translation.
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(d.text)
        paths.append(path)
    return paths


def fresh_seed() -> int:
    """A new unpredictable seed; below 2**53 so that it survives a JSON round trip through JavaScript."""
    return secrets.randbelow(2**53)
