"""The row-invariant session (`Session(block=B)`): decode and verify are one fixed-width block, so a
position's logits are the same bits either way and greedy speculation is token-exact by construction."""

from __future__ import annotations

import pytest
import torch

from engine import speculative as spec
from engine.generate import Session, load_random

B = 7


def _prompt(vocab: int, n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    phrase = torch.randint(0, vocab, (16,), generator=g).tolist()
    return (phrase * (n // 16 + 1))[:n]


def _check_bits(session: Session, prompt: list[int], tokens: list[int]) -> None:
    """Each verify row equals the one-row decode of the same token at the same position, bit for bit."""
    session.reset()
    session.forward(prompt)
    start = session.length
    rows = session.forward(tokens, all_logits=True)
    session.cache.truncate(start)
    for i, tok in enumerate(tokens):
        one = session.forward([tok])
        assert torch.equal(one, rows[i]), f"row {i}: max diff {(one - rows[i]).abs().max().item()}"


@pytest.fixture(scope="module")
def tiny():
    return load_random("qwen3-tiny", "cpu", max_pos=300)


def test_verify_rows_equal_decode_bit_for_bit_and_speculation_is_lossless(tiny):
    s = Session(tiny, max_seq=240, block=B)
    prompt = _prompt(tiny.cfg.vocab_size, 150)
    ar = s.generate(prompt, 48)
    _check_bits(s, prompt, ar.token_ids[:B])
    _check_bits(s, prompt, ar.token_ids[3 : 3 + 4])  # fewer than B rows: padding rows beside them
    outs = [spec.speculative_generate(s, spec.NgramDrafter(3), prompt, 48, B) for _ in range(2)]
    rep = spec.lossless_report(ar.token_ids, [o.token_ids for o in outs])
    assert rep.lossless == 1, rep
    assert outs[0].mean_accept > 1  # the repetitive prompt gives the drafter something to find
    # on-device greedy decode in block mode makes the same tokens as the streamed one
    assert s.generate(prompt, 48, stream=False).token_ids == ar.token_ids


def test_a_wrong_verifier_is_still_caught(tiny):
    s = Session(tiny, max_seq=240, block=B)
    prompt = _prompt(tiny.cfg.vocab_size, 150, seed=1)
    ar = s.generate(prompt, 32)

    def off_by_one(logits, drafts, q, params, gen):
        n, extra = spec.verify_greedy(logits, drafts)
        return n, (extra + 1) % logits.shape[-1]

    out = spec.speculative_generate(s, spec.NgramDrafter(3), prompt, 32, B, verifier=off_by_one)
    assert spec.lossless_report(ar.token_ids, [out.token_ids]).lossless == 0


def test_the_block_session_keeps_its_bounds(tiny):
    s = Session(tiny, max_seq=40, block=B)
    # padding rows sit past max_seq (and past the RoPE table when it is tight): room is made for them
    assert s.cache.max_seq == 40 + B - 1
    ids = _prompt(tiny.cfg.vocab_size, 36)
    s.forward(ids)
    s.forward([1, 2, 3, 4])  # positions 36..39, padding to 42
    assert s.length == 40
    with pytest.raises(ValueError, match="full"):
        s.forward([5])
    with pytest.raises(ValueError, match="exceed"):
        s.generate(ids, 5)
    with pytest.raises(ValueError, match="block"):
        Session(tiny, max_seq=40, block=-1)


def test_padding_rows_past_the_rope_table_are_harmless():
    lm = load_random("qwen3-tiny", "cpu", max_pos=40)  # the table ends at the last real position
    s = Session(lm, max_seq=40, block=B)
    prompt = _prompt(lm.cfg.vocab_size, 30)
    ar = s.generate(prompt, 10)
    out = spec.speculative_generate(s, spec.NgramDrafter(3), prompt, 10, B)
    assert out.token_ids == ar.token_ids


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("compiled", [False, True])
def test_on_the_gpu_bf16_compiled_and_graphed_block_decode_is_bit_exact(compiled):
    lm = load_random("qwen3-tiny", "cuda", max_pos=600)
    if compiled:
        lm.transformer.compile()
    s = Session(lm, max_seq=560, block=B)
    assert s.graphed
    prompt = _prompt(lm.cfg.vocab_size, 400, seed=2)
    ar = s.generate(prompt, 96)
    _check_bits(s, prompt, ar.token_ids[:B])
    _check_bits(s, prompt, ar.token_ids[:3])
    runs = [spec.speculative_generate(s, spec.NgramDrafter(3), prompt, 96, B) for _ in range(3)]
    rep = spec.lossless_report(ar.token_ids, [o.token_ids for o in runs])
    assert rep.lossless == 1, rep


def test_engine_spec_invariant_reports_the_block_mode_and_both_decode_rates():
    from engine import cli

    rec = cli.cmd_spec(
        cli.build_parser().parse_args(
            [
                "spec",
                "--random-weights",
                "--shape",
                "qwen3-tiny",
                "--ngram",
                "3",
                "--ctx",
                "120",
                "--gen",
                "24",
                "--runs",
                "1",
                "--invariant",
            ]
        )
    )
    assert rec["lossless"] == 1 and rec["lossless_runs"] == 1
    assert rec["config"]["invariant"] is True and rec["config"]["block"] == 7
    assert rec["config"]["block_split"] % 64 == 0
    assert rec["plain_decode_tps"] > 0 and rec["block_decode_tps"] > 0 and rec["mean_accept"] >= 1
