"""Byte-level BPE tokenizer built from GGUF metadata, matching llama.cpp token for token.

Everything comes from the ``tokenizer.*`` metadata of a GGUF file (no hub, no tokenizer.json): the
vocabulary, merges and token types feed a Hugging Face ``tokenizers`` BPE model behind the
pre-tokenizer regex that llama.cpp compiles in for ``tokenizer.ggml.pre`` (its rewritten form, not
the tokenizer.json original, so that the splits agree with llama.cpp's). Control, unknown and
user-defined tokens become added tokens, so they are parsed out of the text the way
``llama_tokenize(..., parse_special=true)`` does; decoding follows llama.cpp's ``token_to_piece``
(byte-level decoding for normal tokens, raw text for the others). Chat templates are rendered with a
sandboxed jinja2 environment configured like transformers' ``apply_chat_template``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from tokenizers import AddedToken, Regex, models, pre_tokenizers
from tokenizers import Tokenizer as _HFTokenizer

__all__ = ["PRE_TOKENIZER_PATTERNS", "Tokenizer", "TokenizerError"]


class TokenizerError(ValueError):
    """Tokenizer metadata that cannot be used, or a request the tokenizer cannot serve."""


# llama.cpp's regexes (src/llama-vocab.cpp, llm_tokenizer_bpe), applied in sequence, each splitting
# the pieces the previous one left. qwen2 is llama.cpp's rewrite of Qwen2's tokenizer.json regex: the
# original's "(?i:'s|...)" also folds case over Unicode (it matches "'ſ", U+017F), which llama.cpp's
# explicit [sS] classes do not. GPT-2's regex gets the trailing "|\s+" that llama.cpp's hand-written
# matcher has implicitly, and "default" is llama.cpp's fallback chain for BPE vocabularies.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
PRE_TOKENIZER_PATTERNS: dict[str, tuple[str, ...]] = {
    "qwen2": (
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "gpt-2": (_GPT2,),
    "gpt2": (_GPT2,),  # not a name llama.cpp knows (it calls this one "gpt-2"), kept as an alias
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
}

# llama.cpp classifies codepoints with its own Unicode 15.1 tables (src/unicode-data.cpp), while the
# Oniguruma inside tokenizers knows Unicode 16.0. These are the letters, numbers and punctuation that
# 16.0 added (Garay, Tulu-Tigalari, Egyptian hieroglyphs ext. A, ...): llama.cpp treats them as
# unassigned, so they are taken out of the classes (diffed codepoint by codepoint against
# llama-cpp-python 0.3.36's table). \s needs nothing: both use the same White_Space set.
_UNICODE16_ONLY = {
    r"\p{L}": r"\x{1C89}-\x{1C8A}\x{A7CB}-\x{A7CD}\x{A7DA}-\x{A7DC}\x{105C0}-\x{105F3}\x{10D4A}-\x{10D65}"
    r"\x{10D6F}-\x{10D85}\x{10EC2}-\x{10EC4}\x{11380}-\x{11389}\x{1138B}\x{1138E}\x{11390}-\x{113B5}\x{113B7}"
    r"\x{113D1}\x{113D3}\x{11BC0}-\x{11BE0}\x{13460}-\x{143FA}\x{16100}-\x{1611D}\x{16D40}-\x{16D6C}\x{18CFF}"
    r"\x{1E5D0}-\x{1E5ED}\x{1E5F0}",
    r"\p{N}": r"\x{10D40}-\x{10D49}\x{116D0}-\x{116E3}\x{11BF0}-\x{11BF9}\x{16130}-\x{16139}\x{16D70}-\x{16D79}"
    r"\x{1CCF0}-\x{1CCF9}\x{1E5F1}-\x{1E5FA}",
    r"\p{P}": r"\x{1B4E}-\x{1B4F}\x{1B7F}\x{10D6E}\x{113D4}-\x{113D5}\x{113D7}-\x{113D8}\x{11BE1}\x{16D6D}-\x{16D6F}"
    r"\x{1E5FF}",
}


def _oniguruma(pattern: str) -> str:
    """A llama.cpp pattern for Oniguruma, its Unicode classes narrowed to llama.cpp's Unicode version."""
    for cls, newer in _UNICODE16_ONLY.items():
        # A bracketed intersection is valid both on its own and nested inside another class.
        pattern = pattern.replace(cls, f"[{cls}&&[^{newer}]]")
    return pattern


# GGUF token types (gguf.TokenType).
_UNDEFINED, _NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = range(7)

# llama.cpp recognises these by their text and forces them to control (so they are parsed as specials
# and hidden by skip_special even where the converter typed them normal); the ones in _EOG_TEXTS end
# generation. Lists as of llama.cpp's llama_vocab::impl::load.
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
_FIM_OTHER_TEXTS = (
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "<|code_prefix|>", "<|prefix|>",
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "<|code_suffix|>", "<|suffix|>",
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "<|code_middle|>", "<|middle|>",
)  # fmt: skip
_EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
    "_<EOT>", "[EOT]", "<end_of_utterance>", "<|eom_id|>",
)  # fmt: skip
_EOG_ONLY_TEXTS = (
    "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "</s>", "[EOS]", "<eos>", "<turn|>", "<|tool_response>",
)  # fmt: skip
_EOG_TEXTS = frozenset(_EOT_TEXTS + _EOG_ONLY_TEXTS)
# llama.cpp forces only the first fim text it meets per kind, and none when the GGUF names that id; its
# special cases for gpt-oss and gemma4 vocabularies are left out too. Neither matters for Qwen.
_FORCED_CONTROL_TEXTS = (
    frozenset(_FIM_PAD_TEXTS + _FIM_REP_TEXTS + _FIM_SEP_TEXTS + _FIM_OTHER_TEXTS) | _EOG_TEXTS
)


@lru_cache(maxsize=1)
def _byte_decoder_table() -> dict[int, int]:
    """str.translate table: GPT-2 byte-level character -> the latin-1 character of its byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[256 + shifted] = b  # GPT-2 moved the non-printable bytes up to U+0100..U+0143
            # A raw character of that byte is outside the alphabet: send it to a non-latin-1 sentinel
            # so the fast path below fails over instead of emitting a wrong byte.
            table[b] = 0xFFFF
            shifted += 1
    return table


def _byte_decode(text: str) -> bytes:
    """The bytes a byte-level BPE token stands for; characters outside the alphabet pass as UTF-8."""
    table = _byte_decoder_table()
    try:
        return text.translate(table).encode("latin-1")
    except UnicodeEncodeError:
        alphabet = {c: b for c, b in table.items() if b != 0xFFFF}
        return b"".join(bytes([alphabet[ord(c)]]) if ord(c) in alphabet else c.encode() for c in text)


class Tokenizer:
    """A GGUF vocabulary as an encoder/decoder with llama.cpp's semantics."""

    def __init__(
        self,
        hf: _HFTokenizer,
        tokens: list[str],
        pieces: list[bytes],
        control: frozenset[int],
        bos_id: int | None,
        eos_id: int | None,
        eot_ids: frozenset[int],
        add_bos: bool,
        chat_template: str | None,
    ):
        self._hf = hf
        self._tokens = tokens
        self._pieces = pieces
        self._control = control
        self.vocab_size = len(tokens)
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eot_ids = eot_ids
        self.add_bos = add_bos
        self.chat_template = chat_template
        self._template: Any = None

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> Tokenizer:
        """Build from a GGUF metadata dict (``engine.gguf.GGUFFile(path).metadata``)."""
        model = meta.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise TokenizerError(
                f"tokenizer model {model!r} is not supported (supported: 'gpt2', byte-level BPE)"
            )
        pre = meta.get("tokenizer.ggml.pre") or "default"  # llama.cpp's choice when the key is absent
        if pre not in PRE_TOKENIZER_PATTERNS:
            raise TokenizerError(
                f"pre-tokenizer {pre!r} is not supported (supported: {', '.join(sorted(PRE_TOKENIZER_PATTERNS))})"
            )
        tokens = meta.get("tokenizer.ggml.tokens")
        if not tokens:
            raise TokenizerError("tokenizer.ggml.tokens is missing or empty")
        # llama.cpp renames empty tokens so that every id has a distinct, non-empty text.
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        n = len(tokens)
        types = meta.get("tokenizer.ggml.token_type")
        if types is None:
            types = [_NORMAL] * n
        elif len(types) < n:
            raise TokenizerError(f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
        merges = meta.get("tokenizer.ggml.merges")
        if merges is None:
            raise TokenizerError("tokenizer.ggml.merges is missing (a gpt2 vocabulary needs its merges)")

        vocab = {t: i for i, t in enumerate(tokens)}  # a duplicated text maps to its last id, as in llama.cpp
        # llama.cpp splits a merge at the first space after its first character and keeps the first rank
        # of a repeated pair; tokenizers would keep the last, so drop repeats here.
        pairs: dict[tuple[str, str], None] = {}
        for m in merges:
            cut = m.find(" ", 1)
            if cut > 0:
                pairs.setdefault((m[:cut], m[cut + 1 :]), None)
        try:
            bpe = models.BPE(
                vocab=vocab, merges=list(pairs), fuse_unk=False, byte_fallback=False, ignore_merges=False
            )
        except Exception as exc:  # tokenizers raises a bare Exception for e.g. a merge outside the vocabulary
            raise TokenizerError(
                f"cannot build the BPE model from tokenizer.ggml.tokens and merges: {exc}"
            ) from exc

        hf = _HFTokenizer(bpe)
        splits = [_split(p) for p in PRE_TOKENIZER_PATTERNS[pre]]
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )

        control: set[int] = set()
        user_defined: list[int] = []
        for i, (text, ty) in enumerate(zip(tokens, types, strict=False)):
            if ty in (_CONTROL, _UNKNOWN) or text in _FORCED_CONTROL_TEXTS:
                control.add(i)
            elif ty == _USER_DEFINED:
                user_defined.append(i)
        # Both kinds are cut out of the text before the regex runs (llama.cpp's tokenizer_st_partition).
        # tokenizers matches them leftmost-longest, llama.cpp longest-first: that differs only for
        # special texts that overlap one another, which Qwen's do not.
        hf.add_special_tokens([_added(tokens[i], special=True) for i in sorted(control)])
        hf.add_tokens([_added(tokens[i], special=False) for i in user_defined])

        pieces = [
            _piece(text, ty, i in control) for i, (text, ty) in enumerate(zip(tokens, types, strict=False))
        ]
        bos_id = _token_id(meta, "tokenizer.ggml.bos_token_id", n)
        eos_id = _token_id(meta, "tokenizer.ggml.eos_token_id", n)
        return cls(
            hf=hf,
            tokens=tokens,
            pieces=pieces,
            control=frozenset(control),
            bos_id=bos_id,
            eos_id=eos_id,
            eot_ids=_eog_ids(meta, vocab, eos_id, n),
            add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            chat_template=meta.get("tokenizer.chat_template"),
        )

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of text, special tokens in it parsed as specials; add_bos None follows the GGUF."""
        ids = self._hf.encode(text, add_special_tokens=False).ids if text else []
        if self.add_bos if add_bos is None else add_bos:
            if self.bos_id is None:
                raise TokenizerError("a BOS token was requested but the vocabulary has none")
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """The text of ids (invalid UTF-8 replaced); skip_special drops control tokens such as <|im_end|>."""
        n = self.vocab_size
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise TokenizerError(f"token ids out of range 0..{n - 1}: {bad[:5]}")
        pieces = self._pieces
        if skip_special:
            control = self._control
            raw = b"".join(pieces[i] for i in ids if i not in control)
        else:
            raw = b"".join(pieces[i] for i in ids)
        return raw.decode("utf-8", errors="replace")

    def token_to_piece(self, id: int) -> bytes:
        """The raw bytes of one token (control tokens give their text), possibly a partial UTF-8 sequence."""
        if not 0 <= id < self.vocab_size:
            raise TokenizerError(f"token id {id} out of range 0..{self.vocab_size - 1}")
        return self._pieces[id]

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render tokenizer.chat_template for messages, as transformers' apply_chat_template would."""
        if self._template is None:
            if not self.chat_template:
                raise TokenizerError("the model has no tokenizer.chat_template")
            self._template = _compile_template(self.chat_template)
        special = {
            "bos_token": self._tokens[self.bos_id] if self.bos_id is not None else "",
            "eos_token": self._tokens[self.eos_id] if self.eos_id is not None else "",
        }
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **special
            )
        except TokenizerError:
            raise
        except Exception as exc:  # jinja2 raises many types (UndefinedError, SecurityError, TypeError ...)
            raise TokenizerError(f"chat template failed to render: {type(exc).__name__}: {exc}") from exc


def _split(pattern: str) -> pre_tokenizers.Split:
    """An isolating regex split: matches and the gaps between them both become pieces, as in llama.cpp."""
    return pre_tokenizers.Split(Regex(_oniguruma(pattern)), behavior="isolated", invert=False)


def _added(text: str, special: bool) -> AddedToken:
    return AddedToken(text, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)


def _piece(text: str, ty: int, control: bool) -> bytes:
    """llama.cpp's token_to_piece(special=true) for a BPE vocabulary."""
    if control or ty in (_UNKNOWN, _USER_DEFINED):
        return text.encode()
    if ty == _NORMAL:
        return _byte_decode(text)
    if ty == _BYTE and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        return bytes([int(text[3:5], 16)])
    return b""  # unused and undefined tokens render as nothing


def _token_id(meta: Mapping[str, Any], key: str, n: int) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    if not 0 <= int(value) < n:
        raise TokenizerError(f"{key} = {value} is outside the vocabulary (0..{n - 1})")
    return int(value)


def _eog_ids(meta: Mapping[str, Any], vocab: Mapping[str, int], eos_id: int | None, n: int) -> frozenset[int]:
    """End-of-generation ids the way llama.cpp derives them: fim pad/repo/sep, known texts, eos/eot/eom."""
    eog: set[int] = set()
    for key, texts in (
        ("tokenizer.ggml.fim_pad_token_id", _FIM_PAD_TEXTS),
        ("tokenizer.ggml.fim_rep_token_id", _FIM_REP_TEXTS),
        ("tokenizer.ggml.fim_sep_token_id", _FIM_SEP_TEXTS),
    ):
        found = _token_id(meta, key, n)
        if found is None:
            found = next((vocab[t] for t in texts if t in vocab), None)
        if found is not None:
            eog.add(found)
    eog.update(vocab[t] for t in _EOG_TEXTS if t in vocab)
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        if (found := _token_id(meta, key, n)) is not None:
            eog.add(found)
    if eos_id is not None:
        eog.add(eos_id)
    return frozenset(eog)


def _raise_exception(message: str) -> None:
    raise TokenizerError(f"chat template raised: {message}")


def _tojson(value: Any, indent: int | None = None, separators: Any = None, sort_keys: bool = False) -> str:
    # jinja2's own tojson HTML-escapes <, >, & and '; transformers overrides it with plain json.dumps.
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _compile_template(source: str) -> Any:
    # Imported here: only chat rendering needs jinja2, and the engine's core path should not pay for it.
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateError as exc:
        raise TokenizerError(f"chat template does not compile: {exc}") from exc
