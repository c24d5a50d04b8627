"""The one-token decode step (the path CUDA graphs capture), on the CPU: it must write this step's key
and value into the cache exactly where prefill would, eager and under torch.compile alike."""

from __future__ import annotations

import pytest
import torch

from engine.generate import Session, load
from engine.synthetic import SyntheticSpec, write


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    spec = SyntheticSpec(arch="qwen3", d_model=128, n_head=4, n_kv_head=2, head_dim=64, n_layer=3, seed=5)
    return write(tmp_path_factory.mktemp("step") / "q3.gguf", spec)


def decode_then_prefill(lm, n_prompt: int = 24, n_new: int = 6):
    """Greedy tokens and cache of the decode path, and the cache of prefilling the same tokens."""
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, lm.cfg.vocab_size, (n_prompt,), generator=g).tolist()
    s = Session(lm, 64)
    first = s.forward(prompt).argmax()
    # the decode step: one token per call, its key and value written into the cache inside the step
    new = s.greedy_on_device(first, n_new).tolist()
    ref = Session(lm, 64)
    logits = ref.forward([*prompt, int(first), *new[:-1]], all_logits=True)
    return s, ref, [int(first), *new], logits.argmax(-1)[n_prompt - 1 :].tolist()


def test_decode_step_writes_the_cache_where_prefill_does(gguf):
    s, ref, tokens, prefill_tokens = decode_then_prefill(load(gguf, "cpu"))
    n = s.length
    assert n == ref.length == 24 + 6  # each decode step fed one token and stored its key and value
    assert tokens == prefill_tokens
    torch.testing.assert_close(s.cache.k[:, :, :, :n], ref.cache.k[:, :, :, :n], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s.cache.v[:, :, :, :n], ref.cache.v[:, :, :, :n], atol=1e-5, rtol=1e-5)
    assert s.cache.k[:, :, :, :n].abs().amin(-1).gt(0).all()  # every decoded position was written
    assert s.cache.k[:, :, :, n:].abs().sum() == 0  # and nothing past the last one
    assert s.cache.v[:, :, :, n:].abs().sum() == 0


def test_compiled_decode_step_matches_eager(gguf):
    from torch._dynamo.utils import counters

    eager, compiled = load(gguf, "cpu"), load(gguf, "cpu")
    compiled.transformer.compile()
    a, _, tokens_a, _ = decode_then_prefill(eager)
    graphs = counters["stats"]["unique_graphs"]
    b, _, tokens_b, _ = decode_then_prefill(compiled)
    assert tokens_a == tokens_b
    torch.testing.assert_close(a.cache.k, b.cache.k, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(a.cache.v, b.cache.v, atol=1e-4, rtol=1e-4)
    # compiled once for all 3 layers (their cache views differ only in offset): the decode step's two
    # halves, and each prefill length's two halves (24 and 30 tokens), never a graph per layer
    assert counters["stats"]["unique_graphs"] - graphs == 2 + 2 * 2


@pytest.mark.parametrize("start", [1, 2, 17, 39])
def test_scoring_from_a_position_gives_the_full_scores_rows(gguf, start):
    """An audit scores only the generated tokens after a long prompt: the same rows, none of the rest."""
    lm = load(gguf, "cpu")
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, lm.cfg.vocab_size, (40,), generator=g).tolist()
    full = Session(lm, 64, prefill_chunk=8).score(ids)
    part = Session(lm, 64, prefill_chunk=8).score(ids, start)
    assert full.shape == (39, lm.cfg.vocab_size) and part.shape == (40 - start, lm.cfg.vocab_size)
    torch.testing.assert_close(part, full[start - 1 :], atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="start"):
        Session(lm, 64).score(ids, 40)
