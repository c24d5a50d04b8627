"""Sampling: greedy is argmax, seeds reproduce, top-k and top-p restrict the support."""

from __future__ import annotations

import pytest
import torch

from engine.sampling import SamplingParams, make_generator, probabilities, sample


@pytest.fixture
def logits():
    return torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 3


def test_greedy_is_argmax(logits):
    assert torch.equal(sample(logits, SamplingParams(), None), logits.argmax(-1))


def test_seed_reproduces(logits):
    p = SamplingParams(temperature=0.8, seed=7)
    a = [sample(logits, p, g).tolist() for g in [make_generator(p)] for _ in range(20)]
    b = [sample(logits, p, g).tolist() for g in [make_generator(p)] for _ in range(20)]
    assert a == b


def test_top_k_support(logits):
    p = SamplingParams(temperature=1.0, top_k=5)
    probs = probabilities(logits, p)
    assert ((probs > 0).sum(-1) == 5).all()
    top5 = logits.topk(5, dim=-1).indices
    torch.testing.assert_close(probs.gather(-1, top5).sum(-1), torch.ones(3))


def test_top_p_keeps_smallest_prefix_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.7))
    torch.testing.assert_close(probs, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))


def test_temperature_sharpens(logits):
    hot = probabilities(logits, SamplingParams(temperature=2.0))
    cold = probabilities(logits, SamplingParams(temperature=0.5))
    assert (cold.max(-1).values > hot.max(-1).values).all()


def test_empirical_frequencies_follow_the_distribution():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1]]))
    p = SamplingParams(temperature=1.0, seed=3)
    g = make_generator(p)
    draws = torch.stack([sample(logits, p, g) for _ in range(4000)]).flatten()
    freq = torch.bincount(draws, minlength=3).float() / 4000
    torch.testing.assert_close(freq, torch.tensor([0.6, 0.3, 0.1]), atol=0.03, rtol=0)


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5)])
def test_bad_params(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)
