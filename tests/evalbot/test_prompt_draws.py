"""Prompt draws: deterministic per seed, exact lengths, windows of the (wrapped) corpus, a pinned corpus hash."""

from __future__ import annotations

import shutil

import pytest

from evalbot.evaluate.prompts import (
    CORPUS_V1,
    SEPARATOR,
    Draw,
    corpus_files,
    corpus_sha256,
    default_corpus_dir,
    draw,
    draw_from,
    fresh_seed,
    load_corpus,
    write_prompt_files,
)

# v1 is published and never edited: its hash is pinned here
CORPUS_V1_SHA256 = "54e6eaf6a7c2e12b4d331f37af331839dc5a943b7ddd293bfc17d63d070cebcd"


def test_v1_corpus_is_varied_real_text_of_the_agreed_size():
    files = corpus_files(CORPUS_V1)
    assert 12 <= len(files) <= 20
    for path in files:
        assert 2_000 <= path.stat().st_size <= 6_000, path.name
        path.read_text(encoding="utf-8")  # valid UTF-8
    kinds = {p.name.split("_", 1)[0] for p in files}
    assert {"python", "c", "cpp", "cuda", "rust", "sql", "js", "shell", "markdown", "json"} <= kinds
    assert len(kinds) >= 14  # prose genres as well as code


def test_v1_corpus_hash_is_pinned():
    # v1 is published: new text goes into v2, never into v1 (old receipts must stay reproducible).
    assert default_corpus_dir() == CORPUS_V1
    assert corpus_sha256(CORPUS_V1) == CORPUS_V1_SHA256


def test_same_seed_same_draws_and_different_seeds_differ():
    a = draw(CORPUS_V1, 1234, 500, 8)
    assert a == draw(CORPUS_V1, 1234, 500, 8)
    b = draw(CORPUS_V1, 1235, 500, 8)
    assert [(d.name, d.offset) for d in a] != [(d.name, d.offset) for d in b]


@pytest.mark.parametrize("n_chars", [1, 100, 4_000, 25_000, 150_000])
def test_windows_are_exact_length_substrings_of_the_wrapped_files_they_span(n_chars):
    corpus = load_corpus(CORPUS_V1)
    draws = draw_from(corpus, seed=7, n_chars=n_chars, k=12)
    assert len(draws) == 12
    for d in draws:
        assert len(d.text) == n_chars
        assert d.files[0] == d.name and 0 <= d.offset < len(corpus[d.name])
        assert len(set(d.files)) == len(d.files)
        stream = "".join(corpus[f] + SEPARATOR for f in d.files)
        wrapped = stream * (2 + n_chars // len(stream))
        assert wrapped[d.offset : d.offset + n_chars] == d.text


def test_a_window_within_its_file_is_a_plain_substring_of_it():
    corpus = load_corpus(CORPUS_V1)
    for d in draw_from(corpus, seed=3, n_chars=200, k=30):
        if d.offset + 200 <= len(corpus[d.name]):
            assert d.files == (d.name,)
            assert corpus[d.name][d.offset : d.offset + 200] == d.text


def test_a_long_window_runs_into_other_files_instead_of_repeating_its_own():
    corpus = load_corpus(CORPUS_V1)
    longest = max(len(t) for t in corpus.values())
    total = sum(len(t) + len(SEPARATOR) for t in corpus.values())
    for d in draw_from(corpus, seed=11, n_chars=3 * longest, k=10):
        assert len(d.files) > 1
        # no 500-character stretch of the start file comes round again
        assert d.text.count(corpus[d.name][:500]) <= 1
    (whole,) = draw_from(corpus, seed=11, n_chars=total + 10, k=1)
    assert sorted(whole.files) == sorted(corpus)  # only a window longer than the corpus wraps


def test_draws_do_not_depend_on_mapping_order():
    corpus = load_corpus(CORPUS_V1)
    reordered = dict(reversed(list(corpus.items())))
    assert draw_from(corpus, 99, 300, 5) == draw_from(reordered, 99, 300, 5)


def test_a_one_file_corpus_wraps_round_that_file():
    d = draw_from({"a": "abc"}, seed=0, n_chars=10, k=1)[0]
    assert d.files == ("a",)
    assert d.text == ("abc\n" * 4)[d.offset : d.offset + 10]


def test_bad_arguments_and_bad_corpora(tmp_path):
    with pytest.raises(ValueError):
        draw(CORPUS_V1, 1, 0, 1)
    with pytest.raises(ValueError):
        draw(CORPUS_V1, 1, 10, 0)
    with pytest.raises(ValueError, match="no corpus files"):
        draw(tmp_path, 1, 10, 1)
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="empty corpus files"):
        draw(tmp_path, 1, 10, 1)


def test_corpus_hash_is_stable_and_sees_every_change(tmp_path):
    copy = tmp_path / "corpus"
    shutil.copytree(CORPUS_V1, copy)
    assert corpus_sha256(copy) == corpus_sha256(CORPUS_V1)

    (copy / ".DS_Store").write_bytes(b"junk")  # dotfiles are not corpus
    assert corpus_sha256(copy) == CORPUS_V1_SHA256

    target = copy / "essay_repair.txt"
    original = target.read_bytes()
    target.write_bytes(original.replace(b"silence", b"silences", 1))
    changed = corpus_sha256(copy)
    assert changed != CORPUS_V1_SHA256

    target.write_bytes(original)
    target.rename(copy / "essay_repair2.txt")  # same bytes, new name
    assert corpus_sha256(copy) not in (CORPUS_V1_SHA256, changed)


def test_write_prompt_files_round_trips_exactly(tmp_path):
    draws = [Draw("x", 0, "line one\r\nline two — ünïcode\n"), Draw("y", 3, "tail without newline")]
    paths = write_prompt_files(draws, tmp_path / "prompts")
    assert [p.name for p in paths] == ["prompt-000.txt", "prompt-001.txt"]
    assert [p.read_bytes().decode("utf-8") for p in paths] == [d.text for d in draws]


def test_fresh_seeds_are_json_safe_and_vary():
    seeds = {fresh_seed() for _ in range(20)}
    assert len(seeds) > 1
    assert all(0 <= s < 2**53 for s in seeds)
