"""The GGUF loader: metadata, config, and a specific error for each kind of bad file."""

from __future__ import annotations

import re
import shutil

import gguf
import numpy as np
import pytest
import torch

from engine.config import ConfigError, ModelConfig
from engine.gguf import (
    BadMagic,
    GGUFError,
    GGUFFile,
    MissingTensor,
    TruncatedFile,
    UnsupportedArchitecture,
    UnsupportedTensorType,
    UnsupportedVersion,
)


def test_synthetic_qwen3_config(synthetic_qwen3):
    gf = GGUFFile(synthetic_qwen3)
    assert gf.require_supported() == "qwen3"
    cfg = ModelConfig.from_metadata(gf.metadata, frozenset(gf.tensors))
    assert (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.n_kv_head, cfg.head_dim) == (2, 64, 4, 2, 32)
    assert cfg.qk_norm and not cfg.qkv_bias and not cfg.tied_output
    assert gf.tensor("blk.0.attn_q.weight").shape == (4 * 32, 64)


def test_real_model_config(real_model_path):
    gf = GGUFFile(real_model_path)
    cfg = ModelConfig.from_metadata(gf.metadata, frozenset(gf.tensors))
    assert cfg.arch == "qwen2" and cfg.qkv_bias and not cfg.qk_norm
    assert (cfg.n_layer, cfg.d_model, cfg.n_head, cfg.n_kv_head, cfg.head_dim) == (24, 896, 14, 2, 64)
    assert cfg.vocab_size == 151936 and cfg.rope_base == 1e6


def test_bad_magic(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"GGML" + b"\0" * 60)
    with pytest.raises(BadMagic, match="not a GGUF file"):
        GGUFFile(p)


def test_unsupported_version(tmp_path, synthetic_qwen3):
    p = tmp_path / "v9.gguf"
    data = bytearray(synthetic_qwen3.read_bytes())
    data[4:8] = (9).to_bytes(4, "little")
    p.write_bytes(bytes(data))
    with pytest.raises(UnsupportedVersion, match="version 9"):
        GGUFFile(p)


@pytest.mark.parametrize("keep", [6, 100, 5000, -1000])
def test_truncated_file(tmp_path, synthetic_qwen3, keep):
    data = synthetic_qwen3.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[:keep])
    with pytest.raises(TruncatedFile):
        GGUFFile(p)


def _write(path, arch, tensors):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    for name, arr, raw in tensors:
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_architecture(tmp_path):
    p = _write(tmp_path / "llama.gguf", "llama", [("token_embd.weight", np.ones((4, 32), np.float32), None)])
    with pytest.raises(UnsupportedArchitecture, match="'llama' is not supported"):
        GGUFFile(p).require_supported()
    with pytest.raises(ConfigError):
        ModelConfig.from_metadata(GGUFFile(p).metadata)


def test_unsupported_tensor_type(tmp_path):
    qt = gguf.GGMLQuantizationType.IQ2_XXS
    block, size = gguf.GGML_QUANT_SIZES[qt]
    raw = np.random.default_rng(0).integers(0, 255, (4, 256 // block * size), dtype=np.uint8)
    p = _write(tmp_path / "iq.gguf", "qwen2", [("token_embd.weight", raw, qt)])
    gf = GGUFFile(p)
    with pytest.raises(UnsupportedTensorType, match="IQ2_XXS"):
        gf.require_supported()
    with pytest.raises(UnsupportedTensorType, match="IQ2_XXS"):
        gf.tensor("token_embd.weight")


def test_missing_tensor(synthetic_qwen3):
    with pytest.raises(MissingTensor, match=re.escape("blk.9.attn_q.weight")):
        GGUFFile(synthetic_qwen3).tensor("blk.9.attn_q.weight")


def test_not_a_file(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        GGUFFile(tmp_path / "nope.gguf")


def test_missing_hyperparameter(tmp_path, synthetic_qwen3):
    meta = dict(GGUFFile(synthetic_qwen3).metadata)
    del meta["qwen3.feed_forward_length"]
    with pytest.raises(ConfigError, match="feed_forward_length"):
        ModelConfig.from_metadata(meta)


def test_copy_loads_like_original(tmp_path, synthetic_qwen3):
    p = tmp_path / "copy.gguf"
    shutil.copy(synthetic_qwen3, p)
    a, b = GGUFFile(synthetic_qwen3), GGUFFile(p)
    assert torch.equal(a.tensor("output.weight"), b.tensor("output.weight"))


def _library_metadata(path):
    """The metadata as gguf-py's own reader parses it, one numpy view per array element."""
    from engine.gguf import _field_value

    r = gguf.GGUFReader(str(path), "r")
    return {k: _field_value(f) for k, f in r.fields.items() if not k.startswith("GGUF.")}


def test_compact_arrays_read_as_the_library_does(tmp_path):
    """Arrays of strings (empty, multi-byte, one long), ints, floats and bools parse to the same values as
    gguf-py's per-element path; a nested array takes the library's path and still reads."""
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "qwen2")
    w.add_block_count(1)
    w.add_array("t.strings", ["", "a", "Ġhé", "😀 x", "z" * 5000, *[f"tok{i}" for i in range(3000)]])
    w.add_array("t.ints", list(range(-5, 300)))
    w.add_array("t.floats", [0.5, -1.25, 3.0])
    w.add_array("t.bools", [True, False, True])
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_string("t.one", "plain")
    w.add_tensor("token_embd.weight", np.ones((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    got = GGUFFile(tmp_path / "m.gguf").metadata
    assert got == _library_metadata(tmp_path / "m.gguf")
    assert got["t.strings"][:4] == ["", "a", "Ġhé", "😀 x"] and len(got["t.strings"]) == 3005
    assert got["t.ints"][0] == -5 and got["t.bools"] == [True, False, True] and got["t.nested"] == [1, 2, 3]


def test_real_model_metadata_matches_the_library(real_model_path):
    """The tokenizer's ~150k tokens and merges read the same through the compact path."""
    assert GGUFFile(real_model_path).metadata == _library_metadata(real_model_path)


def test_truncated_string_array(tmp_path):
    """A string array whose lengths run past the end of the file is a TruncatedFile, not a hang or junk."""
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "qwen2")
    w.add_array("t.strings", [f"token-{i}" for i in range(1000)])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    data = (tmp_path / "m.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) - 2000])
    with pytest.raises(TruncatedFile):
        GGUFFile(tmp_path / "cut.gguf")


def test_stacked_is_the_concatenation(synthetic_qwen2, synthetic_qwen3):
    """Dequantized one under the other into one tensor: the same bits as torch.cat of the parts."""
    for path in (synthetic_qwen2, synthetic_qwen3):
        gf = GGUFFile(path)
        names = ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"]
        want = torch.cat([gf.tensor(n) for n in names])
        got = gf.stacked(names)
        assert got.shape == want.shape and torch.equal(got, want)


def test_stacked_refuses_what_does_not_stack(synthetic_qwen3):
    gf = GGUFFile(synthetic_qwen3)
    with pytest.raises(MissingTensor, match=re.escape("blk.9.attn_q.weight")):
        gf.stacked(["blk.0.attn_q.weight", "blk.9.attn_q.weight"])
    with pytest.raises(GGUFError, match="cannot be stacked"):
        gf.stacked(["blk.0.attn_q.weight", "blk.0.ffn_down.weight"])
