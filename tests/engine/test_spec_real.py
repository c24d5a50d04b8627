"""Speculative decoding on the real pair: Qwen2.5-Coder-0.5B drafting for Qwen2.5-Coder-1.5B (CPU, fp32).

Every speculative run must reproduce the AR tokens exactly. The full matrix (64 tokens, 3 runs, ctx 128
and 512) is bench/spec_lossless.py, with its results in docs/benchmarks.md; this is its quicker cut.
"""

from __future__ import annotations

import pytest

from bench.spec_prompts import SECTIONS, prompt_ids
from engine import speculative as spec
from engine.generate import Session, load

pytestmark = pytest.mark.slow
GEN = 32


@pytest.fixture(scope="module")
def sessions(real_model):
    from evalbot.reference.registry import fetch

    target = load(fetch("qwen2.5-coder-1.5b", log=lambda _m: None))
    max_seq = 512 + GEN + spec.DEFAULT_BLOCK
    return Session(target, max_seq), Session(real_model, max_seq)


# prose at ctx 128 and code at 512: both kinds of text and both contexts (the other sections, at either
# context, are bench/spec_lossless.py's matrix, with its results in docs/benchmarks.md)
CASES = [(128, "prose-harbour"), (512, "python-intervals")]
assert all(section in SECTIONS for _, section in CASES)


@pytest.mark.parametrize("ctx,section", CASES)
def test_real_pair_is_lossless(sessions, ctx, section):
    target, draft = sessions
    prompt = prompt_ids(target.model.tokenizer, section, ctx)
    ar = target.generate(prompt, GEN)
    taus = {}
    for drafter in (spec.DraftModelDrafter(draft), spec.NgramDrafter(3)):
        out = spec.speculative_generate(target, drafter, prompt, GEN)
        report = spec.lossless_report(ar.token_ids, [out.token_ids])
        if not report.lossless:
            i = report.first_divergence
            pytest.fail(
                f"{drafter.name} diverges from AR at token {i}; AR top-1/top-2 margin there {ar.margins[i]:.4f}"
            )
        taus[drafter.name] = out.mean_accept
    print(f"\n{section} ctx {ctx}: tau " + ", ".join(f"{k} {v:.2f}" for k, v in taus.items()))
    assert (
        taus["draft-model"] > 1.0
    )  # the 0.5B agrees with the 1.5B often enough to commit several tokens per step
