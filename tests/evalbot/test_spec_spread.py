"""The speculative runs, spread over the A/B's blocks: each block a fresh pair of serving processes, so no one
process pair's offset goes into every run; each run on a prompt the processes running it never saw; and the
spec rate's interval widened where the blocks do explain the runs (a process offset shared by a block's runs
is not a gain)."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from types import SimpleNamespace

import pytest

from evalbot import stats
from evalbot.evaluate import ab_samples, speculative
from evalbot.evaluate.timed import Timed
from evalbot.model import Side
from evalbot.rules import default_rules_dir, load_rules


@pytest.mark.parametrize(("runs", "min_blocks"), [(16, 6), (3, 4), (6, 6), (16, 4), (3, 2), (5, 1)])
def test_the_runs_go_to_blocks_one_to_min_blocks_less_one_half_to_each_load_order(runs: int, min_blocks: int):
    hosts = speculative.hosts(min_blocks)
    share = [speculative.due_by(b, runs, hosts) - speculative.due_by(b - 1, runs, hosts) for b in range(12)]
    assert share[0] == 0  # block 0: no earlier block, so no prompt its processes never saw
    assert sum(share) == runs and speculative.due_by(hosts, runs, hosts) == runs  # all by the last host
    assert not any(share[hosts + 1 :])
    if hosts > 1:  # each load order (odd blocks: the PR's process loaded first) carries half the runs
        assert abs(sum(share[1::2]) - sum(share[2::2])) <= 1
    assert hosts == max(min_blocks - 1, 1)


def test_the_cpu_profiles_sixteen_runs_spread_over_five_blocks_eight_in_each_load_order():
    hosts = speculative.hosts(6)
    assert [speculative.due_by(b, 16, hosts) for b in range(7)] == [0, 3, 7, 10, 14, 16, 16]


def _smp(side: Side, ctx: int, block: int, pair: int) -> ab_samples.Sample:
    return ab_samples.Sample(side, ctx, block, pair, (block, pair, ctx), (1, 2), 100.0, 10.0, {})


def test_a_run_takes_only_prompts_of_earlier_blocks_once_each_and_whole_pairs():
    samples = [
        _smp(s, c, b, p)
        for b in range(3)
        for p in range(2)
        for c in (128, 512)
        for s in (Side.BASE, Side.HEAD)
    ]
    samples.append(_smp(Side.BASE, 128, 0, 9))  # half a pair (its PR side was measured again)
    used: set[tuple[int, int]] = set()
    got = speculative.earlier_pairs(samples, 128, 2, used)
    assert [k for k, _ in got] == [(0, 0), (0, 1), (1, 0), (1, 1)]  # never block 2's own, oldest first
    assert all(set(pair) == {Side.BASE, Side.HEAD} and pair[Side.BASE].context == 128 for _, pair in got)
    used.update(k for k, _ in got[:3])
    assert [k for k, _ in speculative.earlier_pairs(samples, 128, 2, used)] == [(1, 1)]
    assert speculative.earlier_pairs(samples, 128, 0, set()) == []


def test_clustered_runs_with_no_block_effect_read_as_independent_runs():
    rng = __import__("random").Random(5)
    pairs = [(10.0, 10.0 * math.exp(0.05 + rng.gauss(0, 0.1))) for _ in range(16)]
    blocks = [1 + i % 4 for i in range(16)]
    plain, clustered = stats.estimate(pairs), stats.estimate_clustered(pairs, blocks)
    assert clustered.ratio == pytest.approx(plain.ratio)
    assert clustered.half_width == pytest.approx(plain.half_width, rel=0.25)
    assert clustered.df >= 3


def test_a_process_offset_shared_by_a_blocks_runs_is_not_read_as_a_gain():
    """Equal code, each block's processes with an offset of their own (+4%, +3%, -1%, +5%) and the runs
    within a block close together: as independent runs, a gain that excludes 1.0 (what all runs on one
    block's processes gave, and what an A/A run could read as a tier); clustered, no gain."""
    offsets = {1: 0.04, 2: 0.03, 3: -0.01, 4: 0.05}
    pairs, blocks = [], []
    for b, off in offsets.items():
        for j in range(4):
            pairs.append((10.0, 10.0 * math.exp(off + 0.004 * (j - 1.5))))
            blocks.append(b)
    assert stats.estimate(pairs).ci_low > 1.0
    est = stats.estimate_clustered(pairs, blocks)
    assert est.ci_low < 1.0 < est.ci_high
    means = stats.estimate_blocked(pairs, blocks)  # the t-interval over the block means
    assert est.half_width == pytest.approx(means.half_width, rel=0.15)


def test_one_block_or_one_run_a_block_is_the_plain_estimate():
    pairs = [(10.0, 10.5), (10.0, 10.9), (10.0, 10.2), (10.0, 11.0)]
    for blocks in ([1, 1, 1, 1], [1, 2, 3, 4]):
        assert stats.estimate_clustered(pairs, blocks) == stats.estimate(pairs)
    with pytest.raises(stats.StatsError, match="cluster labels"):
        stats.estimate_clustered(pairs, [1, 2])


# ------------------------------------------------------------ the runs of one evaluation, on stand-in processes


class _Proc:
    """A stand-in serving process: the prompts it was sent."""

    def __init__(self, block: int, side: Side):
        self.block, self.side, self.seen = block, side, set()


def _answer(tokens: tuple[int, ...]) -> Timed:
    return Timed({"op": "spec"}, 0, tokens, tuple((i + 1) * 10**7 for i in range(len(tokens))),
                 tuple((t,) for t in tokens), {"event": "done"})  # fmt: skip


@pytest.mark.parametrize("two_part", [True, False])
def test_every_spec_run_is_on_a_prompt_the_processes_running_it_never_saw(monkeypatch, two_part: bool):
    """The cpu profile's spec track (16 runs at ctx 512) through an A/B of 6 blocks, each a fresh pair of
    stand-in processes: with two-part requests the plain references are decoded a block ahead, in other
    processes; with one-part, the earlier blocks' timed pairs are. An engine that remembers its plain answers
    (the replay of `test_fixture_e2e.py`) would find none to replay."""
    rules = load_rules(default_rules_dir())
    profile = rules.model_profile(rules.profile("cpu"), "qwen2.5-coder-0.5b")
    ctx = SimpleNamespace(ws=SimpleNamespace(rules=rules), run_timeout_s=60.0, log=lambda _: None,
                          req=SimpleNamespace(options=SimpleNamespace(max_pairs=None, spec_drafter="ngram")))  # fmt: skip
    tokens = (5, 6, 7, 8)
    serial = iter(range(10**6))
    ran: list[tuple[int, tuple[int, ...]]] = []

    def plain_pair(_ctx, procs, _pool, c, _gen):
        prompt = (next(serial),) * 3
        for p in procs.values():
            p.seen.add(prompt)
        return {s: ab_samples.Sample(s, c, -1, 0, prompt, tokens, 1.0, 1.0, {}) for s in procs}

    def answer_pair(procs, order, req, _timeout, _slice):
        prompt = tuple(req["prompt_ids"])
        assert all(prompt not in procs[s].seen for s in order), "a spec run on a prompt its processes saw"
        ran.append((procs[order[0]].block, prompt))
        return [_answer(tokens) for _ in order]

    monkeypatch.setattr(speculative, "_plain_pair", plain_pair)
    monkeypatch.setattr(speculative.abtest, "answer_pair", answer_pair)
    runs = speculative.SpecRuns(ctx, profile, "qwen2.5-coder-0.5b", 7, ab_samples.Prompts(lambda c, i: []))
    run = ab_samples.Run(two_part=two_part, gen={128: 4, 512: 4}, min_blocks=6)
    for block in range(6):
        procs = {s: _Proc(block, s) for s in (Side.BASE, Side.HEAD)}
        for c in (128, 512):  # the block's timed pairs, on fresh prompts
            for i in range(2):
                prompt = (next(serial),) * 3
                for s, p in procs.items():
                    p.seen.add(prompt)
                    run.samples.append(ab_samples.Sample(s, c, block, i, prompt, tokens, 1.0, 1.0, {}))
        runs.in_block(block, procs, run)
        run.blocks += 1
    results, _ = runs.finish(procs, run)
    assert [r.context for r in results] == [512] and results[0].runs == 16 == len(ran)
    assert sorted(set(results[0].spec_blocks)) == [1, 2, 3, 4, 5] == sorted({b for b, _ in ran})
    assert len({p for _, p in ran}) == 16 and results[0].lossless_runs == 16


def test_equal_code_reads_a_gain_about_as_often_as_the_interval_says_whatever_the_block_effect():
    """A/A spec runs, 16 in 5 blocks (3/4/3/4/2), run-to-run spread 3% and a block offset of 0, 1% or 3% sd
    (as large as the runs' own): the 95% interval's lower bound clears 1.0 in about 2.5% of draws. Read as
    independent runs, a 3% block offset made it 9.9%; the clustered interval keeps it near nominal (3.4% at
    the largest offset: where a draw's blocks happen to explain nothing, its runs are pooled)."""
    rng = random.Random(11)
    for block_sd, most in ((0.0, 0.02), (0.01, 0.03), (0.03, 0.04)):
        clustered = independent = 0
        for _ in range(2000):
            pairs, blocks = [], []
            for b, m in enumerate((3, 4, 3, 4, 2)):
                off = rng.gauss(0, block_sd)
                for _ in range(m):
                    pairs.append((10.0, 10.0 * math.exp(off + rng.gauss(0, 0.03))))
                    blocks.append(b)
            clustered += stats.estimate_clustered(pairs, blocks).ci_low > 1.0
            independent += stats.estimate(pairs).ci_low > 1.0
        assert clustered / 2000 <= most, (block_sd, clustered / 2000)
        if block_sd == 0.03:
            assert independent / 2000 > 0.07  # what treating the runs as independent gave


class _Stage:
    """The cpu profile's spec runs over an A/B of 6 blocks of stand-in processes: plain references decoded on
    fresh prompts (`plain`, or a test's own), spec answers from `answer` (a test's stand-in for
    `abtest.answer_pair`)."""

    def __init__(self, monkeypatch, answer, tokens=(5, 6, 7, 8), plain=None):
        rules = load_rules(default_rules_dir())
        self.profile = rules.model_profile(rules.profile("cpu"), "qwen2.5-coder-0.5b")
        self.logged: list[str] = []
        self.ctx = SimpleNamespace(ws=SimpleNamespace(rules=rules), run_timeout_s=60.0, log=self.logged.append,
                                   req=SimpleNamespace(options=SimpleNamespace(max_pairs=None, spec_drafter="ngram")))  # fmt: skip
        self.tokens, self.serial = tokens, iter(range(10**6))
        monkeypatch.setattr(speculative, "_plain_pair", plain or self.plain)
        monkeypatch.setattr(speculative.abtest, "answer_pair", answer)

    def plain(self, _ctx, procs, _pool, c, _gen):
        prompt = (next(self.serial),) * 3
        return {s: ab_samples.Sample(s, c, -1, 0, prompt, self.tokens, 1.0, 1.0, {}) for s in procs}

    def drive(self) -> tuple[list, ab_samples.Run]:
        runs = speculative.SpecRuns(self.ctx, self.profile, "qwen2.5-coder-0.5b", 7,
                                    ab_samples.Prompts(lambda c, i: []))  # fmt: skip
        gen = len(self.tokens)
        run = ab_samples.Run(two_part=True, gen={128: gen, 512: gen}, min_blocks=6)
        for block in range(6):
            procs = {s: _Proc(block, s) for s in (Side.BASE, Side.HEAD)}
            runs.in_block(block, procs, run)
            run.blocks += 1
        return runs.finish(procs, run)[0], run


def test_a_burst_is_measured_again_on_another_prompt_never_the_same_one(monkeypatch):
    """A side whose spec answer came in one burst is forgiven once (as an A/B pair's) and its run measured
    again: on a prompt neither process has seen, since these processes have now answered that one and
    could replay it. The count of runs stays the rules'."""
    asked: list[tuple[int, ...]] = []
    tokens = (5, 6, 7, 8)

    def answer_pair(procs, order, req, _timeout, _slice):
        asked.append(tuple(req["prompt_ids"]))
        answers = [_answer(tokens) for _ in order]
        if len(asked) == 1:  # the PR's first answer: every token on one line at once
            i = order.index(Side.HEAD)
            answers[i] = Timed(
                {"op": "spec"}, 0, tokens, (10**7,) * len(tokens), (tokens,), {"event": "done"}
            )
        return answers

    stage = _Stage(monkeypatch, answer_pair, tokens)
    results, run = stage.drive()
    assert results[0].runs == 16 and len(asked) == 17  # one measured again
    assert asked[1] != asked[0] and asked.count(asked[0]) == 1  # on another prompt, the burst's never again
    assert run.bursts == {Side.HEAD: 1}
    assert any("speculative run measured again" in line and "burst" in line for line in stage.logged)


def test_a_speculative_run_is_held_to_the_profiles_cores_as_a_timed_request_is(monkeypatch):
    """A PR that drafts on a second core during spec runs (the A/B pairs would catch it, the spec runs did
    not): its run's CPU time over its wall time is past the profile's one thread, and it fails its side."""
    tokens = (5, 6, 7, 8)

    def metered(cores):  # 40 ms of wall from sending to the summary, at `cores` CPU-seconds a second
        t = _answer(tokens)
        return replace(t, done_ns=t.arrivals_ns[-1], cpu_sent_ns=0, cpu_done_ns=int(cores * t.arrivals_ns[-1]),
                       cpu_arrivals_ns=tuple(int(cores * a) for a in t.arrivals_ns))  # fmt: skip

    def answer_pair(procs, order, req, _timeout, _slice):
        return [metered(1.9 if s is Side.HEAD else 1.0) for s in order]

    stage = _Stage(monkeypatch, answer_pair, tokens)
    assert stage.profile.measurement.threads == 1
    with pytest.raises(ab_samples.SideError, match="the PR's serving engine used more cores") as err:
        stage.drive()
    assert err.value.side is Side.HEAD and err.value.stage == "cpu" and "1.90 cores" in str(err.value)


def test_a_burst_in_a_plain_reference_is_forgiven_and_decoded_again_on_a_fresh_prompt(monkeypatch):
    """The plain decode a spec run is checked against (and whose rate the AR gate compares) came in one
    burst: forgiven once a side, as a timed pair's burst is, and decoded again on another prompt."""
    plain: list[tuple[int, ...]] = []
    spec_prompts: list[tuple[int, ...]] = []

    def answer_pair(procs, order, req, _timeout, _slice):
        spec_prompts.append(tuple(req["prompt_ids"]))
        return [_answer(stage.tokens) for _ in order]

    def plain_pair(_ctx, procs, _pool, c, _gen):
        got = stage.plain(_ctx, procs, _pool, c, _gen)
        plain.append(got[Side.BASE].prompt)
        if len(plain) == 2:
            raise ab_samples.BurstError(Side.HEAD, "serve", "4 tokens in 1 line(s) within 3 µs: a burst")
        return got

    stage = _Stage(monkeypatch, answer_pair, plain=plain_pair)
    results, run = stage.drive()
    assert results[0].runs == 16 and run.bursts == {Side.HEAD: 1}
    assert plain[1] not in spec_prompts  # the burst's prompt is never a spec run's
    assert any("plain reference measured again" in line for line in stage.logged), stage.logged


def test_a_line_of_more_tokens_than_a_verify_step_commits_is_a_protocol_error(monkeypatch):
    """Two verify steps streamed as one line read as twice the tau: a line past the block's tokens cannot be
    one step, and fails its side."""
    tokens = tuple(range(20, 30))

    def answer_pair(procs, order, req, _timeout, _slice):
        block = req["block"]
        grouped = (tokens[:1], tokens[1 : 2 + block])  # the first token, then block + 1 in one line
        lines = Timed(
            {"op": "spec"}, 0, tokens, (10**7, 2 * 10**7, 3 * 10**7), (*grouped, tokens[2 + block :]), {}
        )
        return [lines if s is Side.HEAD else _answer(tokens) for s in order]

    with pytest.raises(
        ab_samples.SideError, match="8 tokens in one line, where a verify step commits at most 7"
    ):
        _Stage(monkeypatch, answer_pair, tokens).drive()
