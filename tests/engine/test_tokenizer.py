"""engine.tokenizer: ids identical to llama.cpp's on the real Qwen2.5 vocabulary, and a tiny synthetic one.

llama-cpp-python (``vocab_only=True``) is the reference: every corpus sample, random text from
hypothesis, every token's piece and the end-of-generation set must agree with it exactly.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import gguf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.tokenizer import PRE_TOKENIZER_PATTERNS, Tokenizer, TokenizerError

MODEL = "qwen2.5-coder-0.5b"
IM_START, IM_END, ENDOFTEXT, TOOL_CALL = 151644, 151645, 151643, 151657

CORPUS: dict[str, str] = {
    "python": (
        "import numpy as np\n\n\ndef softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:\n"
        '    """Numerically stable softmax."""\n    z = x - x.max(axis=axis, keepdims=True)\n'
        "    e = np.exp(z)\n    return e / e.sum(axis=axis, keepdims=True)\n\n\n"
        "if __name__ == '__main__':\n    print(softmax(np.array([1.0, 2.0, 3.0])))  # [0.09 0.24 0.67]\n"
    ),
    "cpp_cuda": (
        "#include <cuda_runtime.h>\n\ntemplate <typename T>\n__global__ void axpy(int n, T a, const T* __restrict__ x, T* y) {\n"
        "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) y[i] += a * x[i];\n}\n\n"
        "int main() {\n\taxpy<<<(n + 255) / 256, 256>>>(n, 2.0f, d_x, d_y);\n\tcudaDeviceSynchronize();\n"
        '\tstd::cout << "done" << std::endl; // ok\n\treturn 0;\n}\n'
    ),
    "english": (
        "The quick brown fox jumps over the lazy dog. It wasn't the first time; it won't be the last!\n"
        'Dr. Smith\'s lab (est. 1999) reported a 12.5% increase -- "remarkable", they said.'
    ),
    "german_french": (
        "Größenordnung, Straße, Übermäßig schön; Ärger über Öl. "
        "Où est la bibliothèque ? L'élève a déjà reçu « Les Misérables » — très bien, n'est-ce pas ?"
    ),
    "cjk": "机器学习是人工智能的一个分支。日本語のテキストも大丈夫です。한국어 문장도 포함합니다。",
    "emoji": "Ship it 🚀🚀! Family: 👨‍👩‍👧‍👦, flags 🇩🇪🇫🇷, skin tone 👍🏽, keycap 1️⃣ ❤️‍🔥",
    "arabic_hebrew": "مرحبا بالعالم، كيف حالك؟ ١٢٣ שלום עולם",
    "numbers": "1234567 3.14159 -0.001 1e-9 0xDEADBEEF 1,000,000 ²³ ½ Ⅻ ٣ १२",
    "contractions": "don't I'LL we've they'RE she's it'D you'Ve I'M 'ſt 'ſ O'Brien rock'n'roll",
    "whitespace": "a      b\t\tc\t \t d   \n\n\n   e    \n\t\n  trailing   \n\n\n\n",
    "crlf": "line one\r\nline two\r\n\r\n\tindented\r\nend\r",
    "unicode_spaces": "nbsp\u00a0here, ideographic\u3000space, thin\u2009space, line\u2028sep, para\u2029sep, nel\x85",
    "chatml": (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n<|endoftext|>"
    ),
    "fim": "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c<|fim_middle|><|fim_pad|><|repo_name|>r<|file_sep|>f",
    "user_defined_tokens": '<tool_call>\n{"name": "f"}\n</tool_call> and a stray </s> token',
    "special_fragments": "<|im_start <|im_end|x |> <| <|im_start|><|im_start|> <|endoftext|>x<|endoftext|>",
    "weird_unicode": "e\u0301 n\u0303 a\u030a\u0323 zero\u200bwidth join\u200der \ufeffbom \u00ad soft é vs e\u0301 \U0001d400\U0001d401",
    "control_chars": "null\x00 bell\x07 esc\x1b[0m del\x7f fs\x1c gs\x1d rs\x1e us\x1f",
    "unicode16_letters": "Garay \U00010d4a\U00010d50 Egyptian ext \U00013460'L\U00014147'd Tulu \U00011380x\U00010d40",
    "long_runs": "=" * 100 + " " * 64 + "9" * 40 + "\n" * 20 + "ab" * 50,
}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, to write byte-level vocabularies."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    shifted = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + shifted)
            shifted += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def tiny_metadata(pre: str = "qwen2") -> dict[str, Any]:
    """A byte-level vocabulary: 256 bytes, merges spelling "hello" and " world", three specials, <think>."""
    tokens = [_bytes_to_unicode()[b] for b in range(256)]
    merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d"]  # ids 256..264
    tokens += [m.replace(" ", "") for m in merges]
    types = [1] * len(tokens) + [3, 3, 3, 4]
    tokens += ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>"]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 265,
        "tokenizer.ggml.eos_token_id": 267,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
    }


def write_vocab_gguf(path: Path, meta: dict[str, Any]) -> Path:
    """A tensor-less qwen2 GGUF that llama.cpp opens with vocab_only=True."""
    w = gguf.GGUFWriter(path, arch="qwen2")
    for add, value in [
        (w.add_context_length, 64), (w.add_embedding_length, 8), (w.add_block_count, 1),
        (w.add_feed_forward_length, 16), (w.add_head_count, 2), (w.add_head_count_kv, 1),
        (w.add_layer_norm_rms_eps, 1e-6),
    ]:  # fmt: skip
        add(value)
    w.add_tokenizer_model(meta["tokenizer.ggml.model"])
    w.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    w.add_token_list(meta["tokenizer.ggml.tokens"])
    w.add_token_types(meta["tokenizer.ggml.token_type"])
    w.add_token_merges(meta["tokenizer.ggml.merges"])
    w.add_bos_token_id(meta["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(meta["tokenizer.ggml.eos_token_id"])
    w.add_add_bos_token(meta["tokenizer.ggml.add_bos_token"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def llama_vocab(path: Path) -> Any:
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


def llama_ids(llm: Any, text: str) -> list[int]:
    return llm.tokenize(text.encode(), add_bos=False, special=True)


# --- the real model -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_path() -> Path:
    from evalbot.reference.registry import cached_path

    path = cached_path(MODEL)
    if not path.is_file():
        pytest.skip(
            f"{MODEL} is not cached ({path}); run: python -m evalbot.reference.registry fetch {MODEL}"
        )
    return path


@pytest.fixture(scope="module")
def meta(model_path: Path) -> dict[str, Any]:
    from engine.gguf import GGUFFile

    f = GGUFFile(model_path)
    try:
        return f.metadata
    finally:
        f.close()


@pytest.fixture(scope="module")
def tok(meta: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_metadata(meta)


@pytest.fixture(scope="module")
def llm(model_path: Path) -> Iterator[Any]:
    with closing(llama_vocab(model_path)) as llm:
        yield llm


@pytest.mark.slow
def test_build_is_fast(meta: dict[str, Any]) -> None:
    start = time.perf_counter()
    tok = Tokenizer.from_metadata(meta)
    elapsed = time.perf_counter() - start
    assert tok.vocab_size == len(meta["tokenizer.ggml.tokens"]) == 151936
    assert elapsed < 2.0, f"building from {tok.vocab_size} tokens took {elapsed:.2f}s"


@pytest.mark.slow
def test_model_special_ids(tok: Tokenizer) -> None:
    assert (tok.bos_id, tok.eos_id) == (ENDOFTEXT, IM_END)
    assert {IM_END, ENDOFTEXT} <= tok.eot_ids and IM_START not in tok.eot_ids
    assert tok.encode("hi") == tok.encode("hi", add_bos=False)  # Qwen's add_bos_token is false
    assert tok.encode("hi", add_bos=True)[0] == ENDOFTEXT
    assert tok.encode("") == []


@pytest.mark.slow
@pytest.mark.reference
@pytest.mark.parametrize("name", list(CORPUS))
def test_corpus_matches_llama_cpp(tok: Tokenizer, llm: Any, name: str) -> None:
    text = CORPUS[name]
    assert tok.encode(text) == llama_ids(llm, text)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CORPUS))
def test_corpus_round_trips(tok: Tokenizer, name: str) -> None:
    text = CORPUS[name]
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert b"".join(tok.token_to_piece(i) for i in ids) == text.encode()


_SPECIALS = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "</s>",
]
_PIECES = st.one_of(
    st.characters(exclude_categories=["Cs"]),  # any codepoint, unassigned and private-use ones included
    st.characters(codec="ascii"),
    st.sampled_from([" ", "  ", "\t", "\n", "\r\n", "\n\n\n", "\u00a0", "\u3000", "\x0b", "\x85", "\u2028"]),
    st.sampled_from(_SPECIALS),
    st.sampled_from(["'s", "'LL", "'ve", "'D", "'ſt", "123", "3.14", "<|im_", "|>"]),
)
random_text = st.lists(_PIECES, max_size=48).map("".join)


@pytest.mark.slow
@pytest.mark.reference
@settings(max_examples=200, deadline=None, database=None)
@given(text=random_text)
def test_random_text_matches_llama_cpp(tok: Tokenizer, llm: Any, text: str) -> None:
    ids = tok.encode(text)
    assert ids == llama_ids(llm, text)
    assert tok.decode(ids) == text


@pytest.mark.slow
@pytest.mark.reference
def test_every_piece_and_eog_match_llama_cpp(tok: Tokenizer, llm: Any) -> None:
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    assert llama_cpp.llama_vocab_n_tokens(vocab) == tok.vocab_size
    buf = ctypes.create_string_buffer(256)
    for special in (True, False):
        for i in range(tok.vocab_size):
            n = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, special)
            # special=False is what decode(..., skip_special=True) shows: nothing for control tokens.
            ours = b"" if not special and tok.decode([i], skip_special=True) == "" else tok.token_to_piece(i)
            assert ours == buf.raw[:n], (i, special)
    eog = {i for i in range(tok.vocab_size) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    assert tok.eot_ids == eog


@pytest.mark.slow
@pytest.mark.reference
@pytest.mark.parametrize("pre", ["gpt-2", "default"])
def test_other_pre_tokenizers_match_llama_cpp(meta: dict[str, Any], tmp_path: Path, pre: str) -> None:
    variant = {**meta, "tokenizer.ggml.pre": pre}
    tok = Tokenizer.from_metadata(variant)
    with closing(llama_vocab(write_vocab_gguf(tmp_path / f"{pre}.gguf", variant))) as llm:
        mismatched = [name for name, text in CORPUS.items() if tok.encode(text) != llama_ids(llm, text)]
    assert mismatched == []


@pytest.mark.slow
def test_specials_and_user_defined_tokens(tok: Tokenizer) -> None:
    ids = tok.encode("<|im_start|>user\n<tool_call>x</tool_call><|im_end|>")
    assert ids[0] == IM_START and ids[-1] == IM_END and TOOL_CALL in ids
    assert IM_START not in tok.encode("<|im_start")
    assert tok.decode([IM_END], skip_special=True) == "" and tok.decode([TOOL_CALL], skip_special=True) != ""
    # skip_special hides control tokens only: user-defined ones are text, as in llama.cpp.
    assert tok.decode(ids, skip_special=True) == "user\n<tool_call>x</tool_call>"
    assert tok.token_to_piece(IM_END) == b"<|im_end|>"


@pytest.mark.slow
def test_streaming_pieces_are_bytes(tok: Tokenizer) -> None:
    ids = tok.encode("\U00013000")  # a hieroglyph the vocabulary spells byte by byte
    pieces = [tok.token_to_piece(i) for i in ids]
    assert len(pieces) > 1 and b"".join(pieces) == "\U00013000".encode()
    with pytest.raises(UnicodeDecodeError):
        pieces[0].decode()  # a streaming caller must buffer partial UTF-8 itself
    with pytest.raises(TokenizerError):
        tok.token_to_piece(tok.vocab_size)
    with pytest.raises(TokenizerError):
        tok.decode([0, -1])


@pytest.mark.slow
def test_chat_template_renders_chatml(tok: Tokenizer) -> None:
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Sum 1..10?"}]
    assert tok.apply_chat_template(messages) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nSum 1..10?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.apply_chat_template(messages, add_generation_prompt=False).endswith("Sum 1..10?<|im_end|>\n")
    # Without a system message Qwen's template supplies its default one.
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]).startswith(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    )
    ids = tok.encode(tok.apply_chat_template(messages))
    assert ids.count(IM_START) == 3 and ids.count(IM_END) == 2


# --- a tiny synthetic vocabulary -----------------------------------------------------------------


def test_tiny_vocab_encode_decode() -> None:
    tok = Tokenizer.from_metadata(tiny_metadata())
    assert tok.vocab_size == 269
    hello, world = 259, 264
    assert tok.encode("hello world") == [hello, world]
    assert tok.encode("<|im_start|>hello<|im_end|>") == [266, hello, 267]
    assert tok.encode("<think>hello") == [268, hello]
    assert tok.encode("hello", add_bos=True) == [265, hello]
    assert tok.eot_ids == {265, 267}  # <|endoftext|> by its text, <|im_end|> as eos and by its text
    for text in ["hello world", "héllo, wörld!\n\n  123 🙂", "<|im_start|>x<|im_end|>\n<think>"]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode("<|im_start|>hello<|im_end|>"), skip_special=True) == "hello"
    assert tok.token_to_piece(tiny_metadata()["tokenizer.ggml.tokens"].index("Ġ")) == b" "  # byte-level text


@pytest.mark.reference
@pytest.mark.parametrize("pre", ["qwen2", "gpt-2", "default"])
def test_tiny_vocab_matches_llama_cpp(tmp_path: Path, pre: str) -> None:
    meta = tiny_metadata(pre)
    tok = Tokenizer.from_metadata(meta)
    texts = ["hello world", " hello  world\n", "<|im_start|>hello<|im_end|><think>", "héllo wörld 12345 'll"]
    with closing(llama_vocab(write_vocab_gguf(tmp_path / "tiny.gguf", meta))) as llm:
        for text in [*texts, *CORPUS.values()]:
            assert tok.encode(text) == llama_ids(llm, text), text


def test_tiny_vocab_chat_template() -> None:
    tok = Tokenizer.from_metadata(tiny_metadata())
    assert (
        tok.apply_chat_template([{"role": "user", "content": "hello"}])
        == "<|im_start|>user\nhello<|im_end|>\n"
    )
    raising = {**tiny_metadata(), "tokenizer.chat_template": "{{ raise_exception('no tools here') }}"}
    with pytest.raises(TokenizerError, match="no tools here"):
        Tokenizer.from_metadata(raising).apply_chat_template([])
    untemplated = {k: v for k, v in tiny_metadata().items() if k != "tokenizer.chat_template"}
    with pytest.raises(TokenizerError, match="chat_template"):
        Tokenizer.from_metadata(untemplated).apply_chat_template([{"role": "user", "content": "x"}])


def test_unknown_pre_tokenizer_and_model_are_rejected() -> None:
    with pytest.raises(TokenizerError, match="'tekken'"):
        Tokenizer.from_metadata(tiny_metadata(pre="tekken"))
    with pytest.raises(TokenizerError, match="'llama'"):
        Tokenizer.from_metadata({**tiny_metadata(), "tokenizer.ggml.model": "llama"})
    with pytest.raises(TokenizerError, match="merges"):
        Tokenizer.from_metadata({**tiny_metadata(), "tokenizer.ggml.merges": ["h zz"]})
    assert {"qwen2", "gpt-2", "default"} <= set(PRE_TOKENIZER_PATTERNS)


def test_missing_pre_falls_back_to_default_like_llama_cpp() -> None:
    meta = tiny_metadata()
    del meta["tokenizer.ggml.pre"]
    assert Tokenizer.from_metadata(meta).encode("hello world") == [259, 264]
