"""Transformer.pack: every weight in one allocation at aligned offsets, the same model after it."""

from __future__ import annotations

import torch

from engine import generate as gen


def test_packed_weights_share_one_aligned_allocation_and_decode_the_same_tokens():
    lm = gen.load_random("qwen3-tiny", "cpu", seed=5, max_pos=96)
    prompt = list(range(5, 37))
    before = gen.Session(lm, max_seq=96).generate(prompt, 10).token_ids
    weights = lm.transformer.weights()
    assert len({id(t) for t in weights}) == len(weights)  # each once, a tied output too
    total = lm.transformer.pack(align=4096)
    packed = lm.transformer.weights()
    assert len(packed) == len(weights) and total >= sum(t.numel() * t.element_size() for t in packed)
    base = packed[0].untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() == base for t in packed)  # one allocation
    for t in packed:
        if t.numel() * t.element_size() >= 4096:
            assert (t.data_ptr() - base) % 4096 == 0
    for old, new in zip(weights, packed, strict=True):
        assert torch.equal(old, new)
    assert gen.Session(lm, max_seq=96).generate(prompt, 10).token_ids == before
