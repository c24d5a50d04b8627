"""One A/B pair on a box that others use now and then: measured again on a fresh prompt each time, until a
clean attempt or the quiet budget is spent.

The attack this guards against: an engine that answers a prompt it has seen from a cache. A pair measured
again on the same prompt would time the cached answer; with a fresh prompt per attempt there is nothing to
reuse. The box and the engines are stand-ins here (the real ones are in test_served and test_fixture_e2e).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

from evalbot.evaluate import ab_block, ab_samples, abtest, box
from evalbot.evaluate.timed import Timed
from evalbot.model import Side
from evalbot.rules import Quiet

GEN = 8


@dataclass
class CachingEngine:
    """Decodes at 10 tok/s, except a prompt it has answered before: at once, from its cache."""

    label: str
    seen: set[tuple[int, ...]] = field(default_factory=set)
    frozen: bool = False
    # the CPU time read at the last freeze: -1, unmetered, as a real process without a meter reads
    frozen_cpu_ns: int = -1
    device: None = None  # no GPU idle probe: a CPU profile
    device_idle_ns: int = 0
    clock: itertools.count = field(default_factory=lambda: itertools.count(0, 1))

    def freeze(self, drain: bool = True) -> None:
        self.frozen = True

    def thaw(self) -> None:
        self.frozen = False

    def request(self, body: dict, timeout_s: float) -> Timed:
        prompt = tuple(body["prompt_ids"])
        step = 1_000_000 if prompt in self.seen else 100_000_000  # ns per token: cached vs computed
        self.seen.add(prompt)
        t0 = next(self.clock) * 10**10
        arrivals = tuple(t0 + (k + 1) * step for k in range(GEN))
        return Timed(
            body, t0, tuple(range(GEN)), arrivals, tuple((k,) for k in range(GEN)), {"event": "done"}
        )


def _fake_box(monkeypatch: pytest.MonkeyPatch, busy_attempts: int, clock: list[float]) -> list[str]:
    """The box is busy during the first `busy_attempts` pairs; waiting for quiet costs 10 s of `clock`."""
    calls = {"n": 0}
    waits: list[str] = []

    def busy_reason(usage: object, quiet: Quiet) -> str | None:
        calls["n"] += 1
        return (
            "other processes used 1.2 cores (limit 0.3): hog (1.2)" if calls["n"] <= busy_attempts else None
        )

    def wait_until_quiet(quiet: Quiet, **kw: object) -> tuple[object, float]:
        clock[0] += 10.0
        waits.append("waited")
        return object(), 10.0

    monkeypatch.setattr(box, "cpu_snapshot", lambda: None)
    monkeypatch.setattr(
        box,
        "usage",
        lambda a, b, pid: box.Usage(window_s=1.0, other_cores=1.2, own_cores=1.0, top=(("hog", 1.2),)),
    )
    monkeypatch.setattr(box, "busy_reason", busy_reason)
    monkeypatch.setattr(box, "wait_until_quiet", wait_until_quiet)
    monkeypatch.setattr(abtest.time, "monotonic", lambda: clock[0])
    return waits


def _pair(quiet: Quiet) -> tuple[list[ab_samples.Sample], ab_samples.Prompts, dict[Side, CachingEngine]]:
    procs = {Side.BASE: CachingEngine("main"), Side.HEAD: CachingEngine("the PR")}
    prompts = ab_samples.Prompts(lambda ctx, serial: [serial] * ctx)
    out = abtest._pair(procs, 0, 0, 16, prompts, GEN, 60.0, quiet, False, lambda _m: None, ab_samples.Run())  # type: ignore[arg-type]
    return out, prompts, procs


def test_a_contaminated_pair_is_measured_again_on_a_fresh_prompt_so_a_cache_gains_nothing(monkeypatch):
    clock = [0.0]
    waits = _fake_box(monkeypatch, busy_attempts=5, clock=clock)
    out, prompts, procs = _pair(Quiet(max_other_cores=0.3, max_wait_s=300))
    assert (
        len(waits) == 5 and prompts.served == 6
    )  # five busy attempts, each on its own prompt, then a clean one
    base, head = sorted(out, key=lambda s: s.side is Side.HEAD)
    assert base.prompt == head.prompt == (6,) * 16  # both sides of the pair on the same, new prompt
    assert (
        head.decode_tps == pytest.approx(base.decode_tps) == pytest.approx(10.0)
    )  # nothing came from a cache
    assert all(len(p.seen) == 6 for p in procs.values())


def test_a_box_busy_past_the_quiet_budget_ends_in_box_busy(monkeypatch):
    clock = [0.0]
    _fake_box(monkeypatch, busy_attempts=10**6, clock=clock)
    with pytest.raises(
        box.BoxBusy, match=r"box busy: other processes used .* during 4 attempts at one pair over 30 s"
    ):
        _pair(Quiet(max_other_cores=0.3, max_wait_s=25))


def test_a_short_budget_still_gets_its_three_attempts(monkeypatch):
    clock = [0.0]
    _fake_box(monkeypatch, busy_attempts=2, clock=clock)
    out, prompts, _ = _pair(Quiet(max_other_cores=0.3, max_wait_s=1))
    assert prompts.served == 3 and len(out) == 2


def test_a_blocks_warm_up_requests_are_untimed_each_side_alone_on_prompts_no_pair_reuses(monkeypatch):
    _fake_box(monkeypatch, busy_attempts=0, clock=[0.0])
    procs = {Side.BASE: CachingEngine("main"), Side.HEAD: CachingEngine("the PR")}
    frozen_when_asked: list[bool] = []
    for p in procs.values():
        ask = p.request

        def spy(body: dict, timeout_s: float, _ask=ask, _me=p) -> Timed:
            other = next(q for q in procs.values() if q is not _me)
            frozen_when_asked.append(other.frozen and not _me.frozen)
            return _ask(body, timeout_s)

        p.request = spy  # type: ignore[method-assign]
    prompts = ab_samples.Prompts(lambda ctx, serial: [serial] * ctx)
    ab_block.warm(procs, [16, 32], prompts, GEN, 60.0, "token", 2)  # type: ignore[arg-type]
    assert prompts.served == 4 and all(frozen_when_asked) and len(frozen_when_asked) == 8
    assert {len(k) for k in procs[Side.HEAD].seen} == {16, 32}  # each context's own shapes
    out = abtest._pair(procs, 0, 0, 16, prompts, GEN, 60.0, Quiet(), False, lambda _m: None, ab_samples.Run())  # type: ignore[arg-type]
    # the timed pair takes a prompt no warm-up used: nothing it times comes from a cache
    assert all(s.decode_tps == pytest.approx(10.0) for s in out)


def test_a_failing_warm_up_is_that_sides_failure(monkeypatch):
    from evalbot.evaluate.serve_error import ServeError

    _fake_box(monkeypatch, busy_attempts=0, clock=[0.0])
    procs = {Side.BASE: CachingEngine("main"), Side.HEAD: CachingEngine("the PR")}

    def broken(body: dict, timeout_s: float) -> Timed:
        raise ServeError("the engine exited (code 1)")

    procs[Side.HEAD].request = broken  # type: ignore[method-assign]
    with pytest.raises(ab_samples.SideError, match="warm-up") as err:
        ab_block.warm(procs, [16], ab_samples.Prompts(lambda c, s: [s] * c), GEN, 60.0, "token", 1)  # type: ignore[arg-type]
    assert err.value.side is Side.HEAD


@dataclass
class SteadyEngine:
    """Decodes `gen` tokens at `rate` tok/s on the harness's clock, and records what it was asked."""

    label: str
    rate: float
    asked: list[dict] = field(default_factory=list)
    frozen: bool = False
    frozen_cpu_ns: int = -1
    device: None = None
    device_idle_ns: int = 0
    vocab: int = 100

    def freeze(self, drain: bool = True) -> None:
        self.frozen = True

    def thaw(self) -> None:
        self.frozen = False

    def request(self, body: dict, timeout_s: float) -> Timed:
        self.asked.append(body)
        if body.get("op") == "prefill":
            return Timed(body, 0, (), (), (), {"event": "done"})
        n = body["max_new"]
        step = int(1e9 / self.rate)
        if body.get(
            "continue"
        ):  # answered whole, as the relay asks a timed continuation: one line at the end
            return Timed(body, 0, tuple(range(n)), (n * step,), (tuple(range(n)),), {"event": "done"})
        arrivals = tuple(1_000 + k * step for k in range(n))
        return Timed(body, 0, tuple(range(n)), arrivals, tuple((k,) for k in range(n)), {"event": "done"})


def _length(
    main_rate: float, pr_rate: float = 1.0, decode_s: float = 4.0, two: bool = False
) -> tuple[int, dict]:
    procs = {Side.BASE: SteadyEngine("main", main_rate), Side.HEAD: SteadyEngine("the PR", pr_rate)}
    prompts = ab_samples.Prompts(lambda ctx, serial: [serial] * ctx)
    n = ab_block.request_length(procs, 16, prompts, 24, 60.0, "token", two, decode_s, 256)  # type: ignore[arg-type]
    return n, procs


def test_a_timed_request_lasts_seconds_of_mains_decode_and_only_main_sets_it():
    n, procs = _length(main_rate=25.0)
    assert n == 100  # 4 s at 25 tok/s
    # one untimed request of decode_tokens to each side, the same prompt: both meet block 1 equally warm
    assert [b["max_new"] for b in procs[Side.BASE].asked] == [24]
    assert procs[Side.HEAD].asked == procs[Side.BASE].asked
    # the PR's answer is not read: however fast or slow it decodes, the length is main's
    assert _length(main_rate=25.0, pr_rate=1000.0)[0] == _length(main_rate=25.0, pr_rate=0.5)[0] == 100


def test_the_request_length_is_held_between_decode_tokens_and_its_cap():
    assert _length(main_rate=3.0)[0] == 24  # a slow main: never fewer than decode_tokens
    assert _length(main_rate=500.0)[0] == 256  # a fast one: never more than max_decode_tokens


def test_a_two_part_main_is_timed_from_its_continuation():
    n, procs = _length(main_rate=50.0, decode_s=2.0, two=True)
    ops = [b.get("op") for b in procs[Side.BASE].asked]
    assert n == 100 and ops == ["prefill", "generate"] and procs[Side.BASE].asked[1].get("continue") is True
    assert [b.get("op") for b in procs[Side.HEAD].asked] == ["prefill", "generate"]


@dataclass
class BurstingEngine(CachingEngine):
    """Answers its first `bursts` requests in one burst (every token at the same instant), then honestly."""

    bursts: int = 1

    def request(self, body: dict, timeout_s: float) -> Timed:
        t = super().request(body, timeout_s)
        if self.bursts <= 0:
            return t
        self.bursts -= 1
        return Timed(body, t.sent_ns, t.tokens, (t.arrivals_ns[-1],) * GEN, t.steps, t.summary)


def test_a_burst_is_measured_again_and_an_engine_that_keeps_bursting_fails(monkeypatch):
    """A reader thread kept waiting by a loaded box reads a fast engine's whole answer at once (the lines of one
    read share its time): a burst is measured again on a fresh prompt and its pair is never kept; a side past
    BURSTS_FORGIVEN bursts in the evaluation fails (an engine that bursts on purpose, every time)."""
    _fake_box(monkeypatch, busy_attempts=0, clock=[0.0])
    run, logged = ab_samples.Run(), []
    procs = {Side.BASE: CachingEngine("main"), Side.HEAD: BurstingEngine("the PR", bursts=1)}
    prompts = ab_samples.Prompts(lambda ctx, serial: [serial] * ctx)
    out = abtest._pair(procs, 0, 0, 16, prompts, GEN, 60.0, Quiet(), False, logged.append, run)  # type: ignore[arg-type]
    assert prompts.served == 2 and run.bursts == {Side.HEAD: 1} and "burst" in logged[0]
    assert all(s.decode_tps == pytest.approx(10.0) for s in out)  # the kept pair is the honest one
    procs[Side.HEAD].bursts = 10**6  # an engine that bursts on purpose, every time, later in the evaluation
    with pytest.raises(ab_samples.SideError, match="a burst, not a decode") as info:
        abtest._pair(procs, 0, 1, 16, prompts, GEN, 60.0, Quiet(), False, logged.append, run)  # type: ignore[arg-type]
    assert (
        info.value.side is Side.HEAD
        and run.bursts[Side.HEAD] == ab_samples.BURSTS_FORGIVEN[Side.HEAD] + 1 == 2
    )
