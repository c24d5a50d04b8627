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


def test_a_spec_run_that_decodes_has_its_rate():
    t = _timed((10**6, 10**8, 2 * 10**8), ((1,), (2, 3, 4), (5, 6)))
    assert speculative.spec_rate(Side.HEAD, t) == pytest.approx(5 / 0.199)


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
