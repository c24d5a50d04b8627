"""Real text for benchmarks and scoring: a bundled corpus of prose and code, cut or tiled to length."""

from __future__ import annotations

from importlib import resources
from typing import Protocol


class _Encoder(Protocol):
    def encode(self, text: str, add_bos: bool | None = None) -> list[int]: ...


def corpus_text() -> str:
    """The bundled corpus (prose and code in several languages)."""
    return resources.files("engine").joinpath("data/corpus.txt").read_text(encoding="utf-8")


def tokens_of_length(tokenizer: _Encoder, n: int, text: str | None = None) -> list[int]:
    """Exactly n token ids of real text: the corpus (or text) tokenized, tiled if short, then cut."""
    if n <= 0:
        raise ValueError(f"need a positive token count, got {n}")
    ids = tokenizer.encode(text if text is not None else corpus_text(), add_bos=False)
    if not ids:
        raise ValueError("the text tokenizes to nothing")
    reps = -(-n // len(ids))
    return (ids * reps)[:n]
