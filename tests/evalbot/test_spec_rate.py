"""A speculative run's rate on the harness's clock: a spec answer that comes in one burst (every token in one
line, so no time passed between the first and the last) fails its side with a reason, instead of an
infinite rate that no receipt can carry (it once ended a whole evaluation in a ReceiptError). A PR's burst
that is not lossless fails the lossless gate anyway: it keeps that reason, with its tokens over its whole
answer as its figure."""

from __future__ import annotations

import pytest

from evalbot.evaluate import ab_samples, speculative
from evalbot.evaluate.timed import Timed
from evalbot.model import Side


def _timed(arrivals: tuple[int, ...], steps: tuple[tuple[int, ...], ...]) -> Timed:
    tokens = tuple(t for step in steps for t in step)
    return Timed({"op": "spec"}, 0, tokens, arrivals, steps, {"event": "done"})


def test_a_spec_run_that_decodes_has_its_rate_from_sending_to_its_last_token():
    t = _timed((10**6, 10**8, 2 * 10**8), ((1,), (2, 3, 4), (5, 6)))
    assert speculative.spec_rate(Side.HEAD, t) == pytest.approx(6 / 0.2)


def test_a_spec_answer_computed_up_front_and_spaced_out_gains_nothing():
    """The whole answer computed before the first token (2 s), then its lines spaced a millisecond apart so
    that no burst shows: timed from the first token it would read 2,500 tok/s against an honest 3; from the
    sending, it reads what its work took."""
    honest = _timed(tuple(10**6 + i * 333 * 10**6 for i in range(6)), tuple((i,) for i in range(6)))
    cheat = _timed(tuple(2 * 10**9 + i * 10**6 for i in range(6)), tuple((i,) for i in range(6)))
    assert cheat.decode_tps > 300 * honest.decode_tps  # the first-to-last clock it would have fooled
    assert speculative.spec_rate(Side.HEAD, cheat) < speculative.spec_rate(Side.HEAD, honest)


@pytest.mark.parametrize(
    "arrivals, steps",
    [
        ((10**6,), ((1, 2, 3, 4, 5, 6),)),  # every token in one line
        ((10**6, 10**6), ((1,), (2, 3, 4, 5, 6))),  # two lines at the same instant
    ],
)
def test_a_spec_answer_in_one_burst_fails_its_side_with_a_reason(arrivals, steps):
    with pytest.raises(ab_samples.SideError, match="a burst, not a decode") as info:
        speculative.spec_rate(Side.HEAD, _timed(arrivals, steps))
    assert info.value.side is Side.HEAD and info.value.stage == "serve"


def test_a_prs_burst_that_is_not_lossless_keeps_a_finite_figure_for_the_lossless_gate_to_reject():
    t = _timed((10**6,), ((1, 2, 3, 4, 5, 6),))
    t = Timed(t.request, 0, t.tokens, (2 * 10**8,), t.steps, t.summary)  # sent at 0, answered at 0.2 s
    assert speculative.spec_rate(Side.HEAD, t, lossless=False) == pytest.approx(6 / 0.2)
    with pytest.raises(ab_samples.SideError, match="a burst"):  # main's burst is main's failure
        speculative.spec_rate(Side.BASE, t, lossless=False)


def test_a_quick_runs_pair_cap_bounds_its_spec_runs_above_the_gates_floor():
    """--max-pairs caps the spec runs too (each reuses a timed pair's prompt): 16 asked, 6 pairs, 6 runs; never
    below the gates' floor of 3; without a cap, the rules' count."""
    assert speculative.spec_run_count(16, 3, None) == 16
    assert speculative.spec_run_count(16, 3, 6) == 6
    assert speculative.spec_run_count(16, 3, 2) == 3
    assert speculative.spec_run_count(3, 3, 8) == 3


def test_main_s_prefill_is_spared_on_both_sides_and_an_answer_computed_up_front_still_gains_nothing():
    """The rate is the decode's: each side's time to its first token is spared up to main's prefill at the
    context (1 s here), so a decode twice as fast reads twice the rate instead of a prefill-diluted 1.5x;
    and an answer computed before its first token, then spaced out, still reads what its work took."""
    slow = _timed(
        tuple(10**9 + i * 400 * 10**6 for i in range(6)), tuple((i,) for i in range(6))
    )  # 2 s decode
    fast = _timed(tuple(10**9 + i * 200 * 10**6 for i in range(6)), tuple((i,) for i in range(6)))  # 1 s
    ratio = speculative.spec_rate(Side.HEAD, fast, prefill_s=1.0) / speculative.spec_rate(
        Side.BASE, slow, prefill_s=1.0
    )
    assert ratio == pytest.approx(2.0)
    assert speculative.spec_rate(Side.HEAD, fast) / speculative.spec_rate(Side.BASE, slow) == pytest.approx(
        1.5
    )
    cheat = _timed(
        tuple(3 * 10**9 + i * 10**6 for i in range(6)), tuple((i,) for i in range(6))
    )  # 2 s up front
    assert speculative.spec_rate(Side.HEAD, cheat, prefill_s=1.0) <= speculative.spec_rate(
        Side.BASE, slow, prefill_s=1.0
    )


def test_a_faster_prefill_is_no_speculative_gain():
    """Main's prefill takes 1 s, the PR's 0.5 s, their decodes the same 2 s: the PR is spared only its own
    0.5 s, so both read the same rate (sparing main's 1 s on both sides read the PR 33% faster: its
    prefill's lead counted as decode). Work moved before the first token, up to main's prefill, gains
    nothing either: it is spared only where the PR's prefill was faster than main's, and then as decode
    time it did not save."""
    main = _timed(tuple(10**9 + i * 400 * 10**6 for i in range(6)), tuple((i,) for i in range(6)))
    pr = _timed(tuple(5 * 10**8 + i * 400 * 10**6 for i in range(6)), tuple((i,) for i in range(6)))
    assert speculative.spec_rate(Side.HEAD, pr, prefill_s=1.0) == pytest.approx(
        speculative.spec_rate(Side.BASE, main, prefill_s=1.0)
    )
    # never more than SPARED of a run's own time: a figure stays finite where a run is one line
    one_line = _timed((10**9,), ((1, 2, 3, 4, 5, 6),))
    assert speculative.spec_rate(Side.HEAD, one_line, lossless=False, prefill_s=99.0) == pytest.approx(
        6 / ((1 - speculative.SPARED) * one_line.to_last_s)
    )


def test_the_prefill_spared_is_mains_median_at_the_context_and_the_pr_cannot_move_it():
    def smp(side: Side, ctx: int, prefill_tps: float) -> ab_samples.Sample:
        return ab_samples.Sample(side, ctx, 0, 0, (1,) * ctx, (1, 2), prefill_tps, 10.0, {})

    samples = [smp(Side.BASE, 512, r) for r in (100.0, 128.0, 256.0)] + [smp(Side.BASE, 128, 64.0)]
    assert speculative.spec_prefill_s(samples, 512) == pytest.approx(4.0)  # 512 / 128
    assert speculative.spec_prefill_s([*samples, *(smp(Side.HEAD, 512, 0.5) for _ in range(9))], 512) == 4.0
    assert speculative.spec_prefill_s(samples, 4096) == 0.0
