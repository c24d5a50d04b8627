"""Varied real prompts for speculative-decoding checks: windows of the bundled corpus that start at
different sections (prose, Python, CUDA/C++, SQL/Rust, JavaScript), cut or wrapped to a token count."""

from __future__ import annotations

from engine.prompts import corpus_text

SECTIONS = {
    "prose-harbour": "The harbour town woke slowly.",
    "python-intervals": "def merge_intervals(intervals):",
    "cuda-saxpy": "__global__ void saxpy(",
    "prose-rivers": "Rivers do not run straight for long.",
    "js-debounce": "const debounce = ",
}


def prompt_ids(tokenizer, section: str, n: int) -> list[int]:
    """n token ids of the corpus starting at a named section (wrapping around to the start if needed)."""
    text = corpus_text()
    start = text.index(SECTIONS[section])
    ids = tokenizer.encode(text[start:] + "\n\n" + text[:start], add_bos=False)
    return (ids * (n // len(ids) + 1))[:n]
