"""Speculative decoding: drafters, verification, losslessness, τ, and the rejection sampler's distribution."""

from __future__ import annotations

import pytest
import torch

from bench.spec_prompts import SECTIONS, prompt_ids
from engine import speculative as spec
from engine.generate import Session, load
from engine.sampling import SamplingParams, probabilities
from engine.synthetic import SyntheticSpec, write


def test_ngram_lookup_prefers_the_longest_then_latest_match():
    seq = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    assert spec.lookup(seq, 3, 2) == [7, 8]  # "2 3" last seen before "7 8"; "5 2 3" never seen
    assert spec.lookup([4, 5, 6, 4, 5], 2, 3) == [6, 4, 5]
    assert spec.lookup([1, 2, 3], 3, 4) == []
    assert spec.lookup([1, 2, 1], 1, 5) == [2, 1]  # the continuation may be shorter than k
    assert spec.lookup([1, 2, 1, 2], 2, 0) == []


def test_greedy_verification_takes_the_matching_prefix_plus_the_target_token():
    logits = torch.full((4, 10), -5.0)
    for row, best in enumerate([3, 4, 6, 8]):
        logits[row, best] = 5.0
    assert spec.verify_greedy(logits, [3, 4, 5]) == (2, 6)
    assert spec.verify_greedy(logits, [3, 4, 6]) == (3, 8)
    assert spec.verify_greedy(logits, [0, 4, 6]) == (0, 3)
    assert spec.verify_greedy(logits[:1], []) == (0, 3)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny target and a different tiny draft model with the same (trained) vocabulary."""
    d = tmp_path_factory.mktemp("spec")
    target = load(write(d / "t.gguf", SyntheticSpec(arch="qwen3", seed=11)))
    draft = load(write(d / "d.gguf", SyntheticSpec(arch="qwen3", n_layer=1, seed=12)))
    return target, draft


def _runs(target, drafter, prompt, n, runs=3, block=7, verifier=spec.default_verifier):
    s = Session(target, len(prompt) + n + block)
    return [spec.speculative_generate(s, drafter, prompt, n, block, verifier=verifier) for _ in range(runs)]


@pytest.mark.parametrize("kind", ["draft", "ngram", "self"])
def test_speculative_output_equals_autoregressive(pair, kind):
    target, draft = pair
    prompt = prompt_ids(target.tokenizer, "python-intervals", 96)
    ar = Session(target, 200).generate(prompt, 48).token_ids
    model = {"draft": draft, "self": target}.get(kind)
    drafter = spec.NgramDrafter(3) if model is None else spec.DraftModelDrafter(Session(model, 200))
    outs = _runs(target, drafter, prompt, 48)
    report = spec.lossless_report(ar, [o.token_ids for o in outs])
    assert report.lossless == 1 and report.lossless_runs == 3, report
    for o in outs:
        assert 1.0 <= o.mean_accept <= 7.0
        assert (
            sum(k * v for k, v in o.accept_hist.items()) == 48 - 1
        )  # every token after the first is committed by a step
    if kind == "self":
        # the target drafting for itself: everything is accepted, except where the requested length cuts a block
        assert outs[0].mean_accept >= 0.98 * (47 / -(-47 // 7))


def test_a_verifier_that_skips_verification_is_caught(pair):
    target, draft = pair
    prompt = prompt_ids(target.tokenizer, "prose-rivers", 64)
    ar = Session(target, 200).generate(prompt, 40).token_ids

    def accept_everything(logits, drafts, q, params, gen):  # the cheat: never looks at the target
        return len(drafts), int(logits[len(drafts)].argmax())

    outs = _runs(target, spec.DraftModelDrafter(Session(draft, 200)), prompt, 40, verifier=accept_everything)
    report = spec.lossless_report(ar, [o.token_ids for o in outs])
    assert report.lossless == 0 and report.first_divergence is not None
    assert outs[0].mean_accept > 5  # it looks great on τ, which is exactly why the lossless gate exists


def test_lossless_report():
    assert spec.lossless_report([1, 2, 3], [[1, 2, 3], [1, 2, 3]]) == spec.LosslessReport(1, 2, 2, None)
    assert spec.lossless_report([1, 2, 3], [[1, 2, 3], [1, 5, 3]]) == spec.LosslessReport(0, 1, 2, 1)
    assert spec.lossless_report([1, 2, 3], [[1, 2]]).first_divergence == 2
    assert spec.lossless_report([1, 2], []).lossless == 0


def _chi2_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    keep = expected > 0
    stat = float((((observed - expected) ** 2)[keep] / expected[keep]).sum())
    dof = int(keep.sum()) - 1
    return float(
        torch.special.gammaincc(
            torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
        )
    )


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_rejection_sampling_reproduces_the_target_distribution(pair, drafter):
    """Chi-square: the token out of a verify step follows the target's p, whatever the drafts' q."""
    target, draft = pair
    params = SamplingParams(temperature=1.0, top_k=12, seed=0)
    ids = prompt_ids(target.tokenizer, "prose-harbour", 32)
    p_logits = Session(target, 64).forward(ids)[None].repeat(2, 1)  # rows for the draft and the bonus
    q = probabilities(Session(draft, 64).forward(ids)[None], params)[0]
    p_target = probabilities(p_logits, params)  # the target's distributions, as default_verifier passes them
    p = p_target[0].double()
    assert (p > 0).sum() == 12 and (q > 0).sum() == 12 and not torch.allclose(p, q.double(), atol=1e-3)
    gen = torch.Generator().manual_seed(1234)
    n = 20000
    counts = torch.zeros_like(p)
    accepted = 0
    fixed = int(torch.argsort(p, descending=True)[3])  # an n-gram draft: plausible, not the favourite
    for _ in range(n):
        if drafter == "model":
            x = int(torch.multinomial(q, 1, generator=gen))
            n_ok, extra = spec.verify_sampling(p_target, [x], q[None], gen)
        else:
            x = fixed
            n_ok, extra = spec.verify_sampling(p_target, [x], None, gen)
        counts[x if n_ok else extra] += 1  # the step's first token: the accepted draft or the residual sample
        accepted += n_ok
    pvalue = _chi2_pvalue(counts, p * n)
    assert pvalue > 1e-3, f"chi-square p-value {pvalue:.2e}: output does not follow the target's distribution"
    # acceptance follows theory: E[accept] = sum_x min(p, q) (model) or p(x) (one-hot draft)
    expected = float(torch.minimum(p, q.double()).sum()) if drafter == "model" else float(p[fixed])
    assert abs(accepted / n - expected) < 0.02


def test_sampled_speculative_generation_matches_ar_marginals(pair):
    """End to end at temperature 1: the 2nd and 3rd generated tokens have the same distribution as AR sampling."""
    target, draft = pair
    ids = prompt_ids(target.tokenizer, "js-debounce", 24)
    runs = 600
    ar_counts, sp_counts = torch.zeros(2, 384), torch.zeros(2, 384)
    ts, ds = Session(target, 40), Session(draft, 40)
    drafter = spec.DraftModelDrafter(ds)
    for seed in range(runs):
        params = SamplingParams(temperature=1.0, top_k=6, seed=seed)
        a = ts.generate(ids, 3, params).token_ids
        b = spec.speculative_generate(ts, drafter, ids, 3, 4, params).token_ids
        for j in (1, 2):
            ar_counts[j - 1, a[j]] += 1
            sp_counts[j - 1, b[j]] += 1
    for j in range(2):
        # two-sample chi-square on the tokens either side produced
        keep = (ar_counts[j] + sp_counts[j]) > 0
        a, b = ar_counts[j][keep].double(), sp_counts[j][keep].double()
        stat = float(((a - b) ** 2 / (a + b)).sum())
        dof = int(keep.sum()) - 1
        pvalue = float(
            torch.special.gammaincc(
                torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
            )
        )
        assert pvalue > 1e-3, f"token {j + 1}: p-value {pvalue:.2e}"


def test_spec_prompts_are_varied(pair):
    target, _ = pair
    firsts = {tuple(prompt_ids(target.tokenizer, name, 8)) for name in SECTIONS}
    assert len(firsts) == len(SECTIONS) == 5
