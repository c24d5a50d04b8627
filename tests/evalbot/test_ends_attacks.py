"""Attacks on the `stream: ends` served protocol, from a PR that controls its engine package.

The PR's code shares the serving process with `engine/serve.py`: it can reach the Server through the
`on_token` closure it is handed and write any line, or none, whenever it likes. Nothing serve.py checks is
a boundary; what the bot checks on arrival (`served.ServedProcess.request`, `ab_sampling.sample`) and what the
verdict guards are. Each test plays one attack against those and asserts that it is refused, or that it
buys nothing. The ones marked xfail(strict) are holes in the current code: the reason names the hole
(three more found this way are closed: a line sent ahead of its request, a vocabulary the PR names
itself, an ends stream of another shape).

Three kinds of process: small stand-ins that print whatever lines an attacker would (`_fake`), the real
`engine serve` on a tiny random shape with the PR's `Session.generate` replaced by a hostile one
(`hostile`), and synthetic harness clocks fed to the verdict (`_verdict`)."""

from __future__ import annotations

import dataclasses
import os
import random
import sys
import textwrap
import time
from pathlib import Path

import pytest

from evalbot.evaluate import (
    ab_block,
    ab_samples,
    ab_sampling,
    ab_twopart,
    abtest,
    audit,
    sandbox,
    serve_error,
    served,
    timed,
)
from evalbot.model import Measurements, Provenance, Side, Status
from evalbot.rules import Quiet, default_rules_dir, load_rules
from evalbot.verdict.decide import decide

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]
GEN = 8  # tokens per request in the stand-ins: the ends stream's two lines either way
TOKS = [(7 * i + 1) % 100 for i in range(GEN)]  # what the stand-ins decode (vocab 100)


def _spec(tmp: Path, cap: int = 1 << 20) -> sandbox.SandboxSpec:
    return sandbox.SandboxSpec(
        ro_binds=(),
        scratch=tmp,
        workdir=tmp,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        limits=sandbox.Limits(max_output_bytes=cap, timeout_s=60),
    )


def _start(tmp: Path, script: str, label: str = "fake", cap: int = 1 << 20) -> served.ServedProcess:
    path = tmp / f"{label}.py"
    path.write_text(script)
    return served.ServedProcess.start(label, _spec(tmp, cap), [PY, str(path)], no_sandbox=True)


def _fake(tmp: Path, body: str, vocab: int = 100, label: str = "fake") -> served.ServedProcess:
    """A stand-in server (as tests/evalbot/test_served.py's): ready with `vocab`, then `body`."""
    head = textwrap.dedent(f"""
        import json, sys, threading, time
        def send(o):
            sys.stdout.write(json.dumps(o) + "\\n"); sys.stdout.flush()
        send({{"event": "ready", "protocol": "evalbot.serve/1", "config": {{"vocab_size": {vocab}}}}})
    """)
    return _start(tmp, head + textwrap.dedent(body), label)


def _serving(plan: str) -> str:
    """A stand-in that answers every generate request with `plan` (rid, n and toks in scope)."""
    return textwrap.dedent("""
        for line in sys.stdin:
            req = json.loads(line)
            if req.get("op") == "shutdown":
                break
            rid, n = req["id"], req["max_new"]
            toks = [(7 * i + 1) % 100 for i in range(n)]
        """) + textwrap.indent(textwrap.dedent(plan), "    ")


HONEST = """
send({"id": rid, "tok": toks[0]})
time.sleep(0.01)
send({"id": rid, "toks": toks[1:]})
send({"id": rid, "event": "done", "n": n})
"""


def _ends(p: served.ServedProcess, gen: int = GEN) -> timed.Timed:
    return p.request({"op": "generate", "prompt_ids": [1, 2, 3], "max_new": gen, "stream": "ends"}, 10)


def _sample(t: timed.Timed, gen: int = GEN) -> ab_samples.Sample:
    return ab_sampling.sample(Side.HEAD, 3, 0, 0, [1, 2, 3], gen, t, stream="ends")


@pytest.fixture
def fake(tmp_path):
    started: list[served.ServedProcess] = []

    def start(body: str, vocab: int = 100) -> served.ServedProcess:
        p = _fake(tmp_path, body, vocab)
        started.append(p)
        p.wait_ready(10)
        return p

    yield start
    for p in started:
        p.close()


# ------------------------------------------------------------------ lines an engine prints: refused


def test_the_honest_stand_in_is_accepted(fake):
    s = _sample(_ends(fake(_serving(HONEST))))
    assert list(s.tokens) == TOKS and s.decode_s >= 0.01 and s.decode_tps <= 7 / 0.01


@pytest.mark.parametrize(
    ("plan", "words"),
    [
        (  # the rest in pieces: the lines the ends stream forbids, each one a timestamp
            """
            send({"id": rid, "tok": toks[0]}); time.sleep(0.01)
            send({"id": rid, "toks": toks[1:4]}); time.sleep(0.01)
            send({"id": rid, "toks": toks[4:]}); send({"id": rid, "event": "done", "n": n})
            """,
            "in 3 lines",
        ),
        (  # stream=False ignored: a line per token
            """
            for t in toks:
                send({"id": rid, "tok": t}); time.sleep(0.002)
            send({"id": rid, "event": "done", "n": n})
            """,
            f"in {GEN} lines",
        ),
        (  # no first line at all: everything when the last is decoded
            """
            time.sleep(0.01); send({"id": rid, "toks": toks}); send({"id": rid, "event": "done", "n": n})
            """,
            "in 1 lines",
        ),
        (  # the first token twice: one more token than asked for
            """
            send({"id": rid, "tok": toks[0]}); send({"id": rid, "tok": toks[0]}); time.sleep(0.01)
            send({"id": rid, "toks": toks[1:]}); send({"id": rid, "event": "done", "n": n})
            """,
            f"the engine streamed {GEN + 1}",
        ),
        (  # the last tokens in the done line, where no token counts
            """
            send({"id": rid, "tok": toks[0]}); time.sleep(0.01)
            send({"id": rid, "toks": toks[1:-2]})
            send({"id": rid, "event": "done", "n": n, "toks": toks[-2:]})
            """,
            f"the engine streamed {GEN - 2}",
        ),
        (  # a done line that claims every token after the first line alone
            """
            send({"id": rid, "tok": toks[0]}); time.sleep(0.01); send({"id": rid, "event": "done", "n": n})
            """,
            "the engine streamed 1",
        ),
    ],
    ids=["pieces", "per-token", "one-line", "duplicate-first", "tokens-in-done", "done-claims-n"],
)
def test_an_ends_stream_of_another_shape_is_refused_by_the_sample(fake, plan, words):
    t = _ends(fake(_serving(plan)))  # the harness takes the lines as they came...
    with pytest.raises(ab_samples.SideError, match=words):  # ...and the sample refuses them
        _sample(t)


@pytest.mark.parametrize(
    ("plan", "words"),
    [
        (  # the rest twice: more tokens than asked for, stopped while it streams
            """
            send({"id": rid, "tok": toks[0]}); time.sleep(0.01)
            send({"id": rid, "toks": toks[1:]}); send({"id": rid, "toks": toks[1:]})
            send({"id": rid, "event": "done", "n": n})
            """,
            "more tokens than asked for",
        ),
        (  # the rest under another request's id
            """
            send({"id": rid, "tok": toks[0]}); time.sleep(0.01)
            send({"id": rid + "x", "toks": toks[1:]}); send({"id": rid, "event": "done", "n": n})
            """,
            "a line for request",
        ),
        (  # an id-less line
            """
            send({"id": rid, "tok": toks[0]}); send({"toks": toks[1:]})
            """,
            "a line for request 'None'",
        ),
        (  # a line of neither kind
            """
            send({"id": rid, "tok": toks[0]}); send({"id": rid, "event": "progress", "n": n})
            """,
            "not a token line",
        ),
    ],
    ids=["rest-twice", "other-id", "no-id", "other-event"],
)
def test_an_ends_stream_with_a_stray_line_is_stopped_while_it_streams(fake, plan, words):
    with pytest.raises(serve_error.ServeError, match=words):
        _ends(fake(_serving(plan)))


@pytest.mark.parametrize(
    "bad",
    [100, -1, True, False, 3.0, "7", None, [1], {"t": 1}, 10**30],
    ids=["vocab", "negative", "true", "false", "float", "string", "null", "nested", "object", "huge"],
)
def test_a_token_outside_the_vocabulary_or_of_another_type_is_refused(fake, bad):
    plan = f"""
    send({{"id": rid, "tok": toks[0]}}); time.sleep(0.01)
    send({{"id": rid, "toks": [*toks[1:-1], {bad!r}]}}); send({{"id": rid, "event": "done", "n": n}})
    """
    with pytest.raises(serve_error.ServeError, match="not a token line"):
        _ends(fake(_serving(plan)))


@pytest.mark.parametrize("first", ['{"id": rid, "tok": True}', '{"id": rid, "toks": []}'])
def test_a_first_line_without_one_valid_token_is_refused(fake, first):
    plan = f"send({first}); send({{'id': rid, 'toks': toks[1:]}}); send({{'id': rid, 'event': 'done'}})"
    with pytest.raises(serve_error.ServeError, match="not a token line"):
        _ends(fake(_serving(plan)))


def test_a_toks_line_past_the_line_cap_stops_the_engine(fake):
    plan = """
    send({"id": rid, "tok": toks[0]})
    sys.stdout.write('{"id": "%s", "toks": [%s' % (rid, " " * (1 << 20)) + "1]}\\n"); sys.stdout.flush()
    """
    with pytest.raises(serve_error.ServeError) as info:
        _ends(fake(_serving(plan)))
    assert info.value.stage == "output" and "MiB a protocol line" in str(info.value)


def test_a_line_left_over_from_the_last_request_fails_the_next(fake):
    p = fake(_serving(HONEST + 'send({"id": rid, "toks": toks[1:]})\n'))
    assert _sample(_ends(p)).tokens  # the stale line comes after the summary...
    # ...and is refused as the next request's answer: read before the request went out, or after it
    # (which of the two depends on when the reader thread ran)
    with pytest.raises(
        serve_error.ServeError, match=r"'g1' arrived before the request was sent|'g1' while g2"
    ):
        _ends(p)


def test_the_engine_s_own_count_and_timings_decide_nothing(fake):
    plan = """
    send({"id": rid, "tok": toks[0]}); time.sleep(0.05); send({"id": rid, "toks": toks[1:]})
    send({"id": rid, "event": "done", "n": 10**6, "timings": {"prefill_s": 1e-9, "decode_s": 1e-9}})
    """
    s = _sample(_ends(fake(_serving(plan))))
    assert (
        list(s.tokens) == TOKS and s.reported_n == 10**6
    )  # a diagnostic (served_model._diagnostics), no more
    assert s.decode_s >= 0.05 and s.decode_tps <= (GEN - 1) / 0.05  # the harness's clock, not the claim


# ------------------------------------------------------------------ holes (xfail strict: see reasons)


def test_a_first_line_of_many_tokens_is_refused(fake):
    plan = """
    send({"id": rid, "toks": toks[:6]}); time.sleep(0.01)
    send({"id": rid, "toks": toks[6:]}); send({"id": rid, "event": "done", "n": n})
    """
    t = _ends(fake(_serving(plan)))
    assert [len(x) for x in t.steps] == [6, GEN - 6]
    with pytest.raises(ab_samples.SideError):
        _sample(t)


@pytest.mark.timing
def test_a_line_sent_ahead_of_its_request_is_refused(fake):
    plan = """
    ahead = globals().setdefault("ahead", set())
    if rid not in ahead:  # the first token of a request it answered ahead is out already
        send({"id": rid, "tok": toks[0]})
    time.sleep(0.01); send({"id": rid, "toks": toks[1:]}); send({"id": rid, "event": "done", "n": n})
    ahead.add("g%d" % (int(rid[1:]) + 1)); send({"id": "g%d" % (int(rid[1:]) + 1), "tok": 1})
    """
    p = fake(_serving(plan))
    _sample(_ends(p))
    time.sleep(0.2)  # the other side is timed meanwhile; the guessed line is already read
    with pytest.raises((serve_error.ServeError, ab_samples.SideError)):
        t = p.request({"op": "generate", "prompt_ids": [1, 2, 3], "max_new": 2, "stream": "ends"}, 10)
        # what it buys, failing that: a zero prefill, and a decode as long as the wait (no speed)
        assert t.prefill_s < 0 and t.decode_s >= 0.2
        _sample(t, gen=2)


def test_a_head_that_claims_a_larger_vocabulary_cannot_stream_tokens_past_main_s(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "head").mkdir()
    big = _serving(HONEST.replace("toks[1:]", "[t + 5000 for t in toks[1:]]"))
    bodies = {Side.BASE: (_serving(HONEST), 100), Side.HEAD: (big, 10**9)}

    def launch(side: Side) -> served.ServedProcess:
        body, vocab = bodies[side]
        return _fake(tmp_path / side.value, body, vocab, label=side.value)

    procs: dict[Side, served.ServedProcess] = {}
    try:
        with pytest.raises(ab_samples.SideError) as info:
            procs = ab_block.start_block(launch, 10, lambda _m: None)
            abtest._pair(
                procs, 0, 0, 3, ab_samples.Prompts(lambda c, i: [1] * c), GEN, 10,
                Quiet(max_other_cores=1e9, max_gpu_util=100, sample_s=0.01, max_wait_s=1),
                False, lambda _m: None, ab_samples.Run(), stream="ends",
            )  # fmt: skip
        assert info.value.side is Side.HEAD
    finally:
        ab_block.close(procs)


# ------------------------------------------------------------------ the real serve.py, a hostile engine

HOSTILE = """
import argparse, sys, time
sys.path.insert(0, {repo!r})
import torch
torch.set_num_threads(1)
from engine import generate as gen, serve

real = gen.Session.generate

def cells(fn):  # the closure serve.py hands the engine: its Server, the request id, what was sent
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__)))

def hostile(self, prompt_ids, max_new, params=None, stop_ids=frozenset(), on_token=None, stream=True, resume=False):
    mode = params.seed  # greedy: the seed picks the attack and changes nothing else
    if mode == 1:  # honest
        return real(self, prompt_ids, max_new, params, stop_ids, on_token, stream, resume=resume)
    if mode == 4:  # stream=False ignored: every token handed over as it comes
        return real(self, prompt_ids, max_new, params, stop_ids, on_token, True, resume=resume)
    out = real(self, prompt_ids, max_new, params, stop_ids, None, True, resume=resume)
    c = cells(on_token)
    srv, rid, ids = c["self"], c["rid"], list(out.token_ids)
    if mode == 2:  # past serve.py: the rest in pieces, written on its protocol stream directly
        on_token(ids[0])
        srv.send({{"id": rid, "toks": ids[1:3]}}); time.sleep(0.01); srv.send({{"id": rid, "toks": ids[3:]}})
        out.token_ids = ids[:1]
    elif mode == 3:  # other tokens than it streamed
        on_token((ids[0] + 1) % 2048)
    elif mode == 5:  # the same, with serve.py's own record of what it sent rewritten to match
        on_token((ids[0] + 1) % 2048)
        c["sent"][0] = ids[0]
        time.sleep(0.02)  # a decode's worth of time before the rest, not a burst
    elif mode == 6:  # the whole decode before the first token, then a gap before the rest
        on_token(ids[0])
        time.sleep(0.05)
    return out

gen.Session.generate = hostile
p = argparse.ArgumentParser()
serve.add_parser(p.add_subparsers())
args = p.parse_args(
    "serve --random-weights --shape qwen3-tiny --seed 3 --max-seq 128 --warmup 0 --device cpu".split()
)
sys.exit(serve.serve(args))
"""

PROMPT = list(range(3, 40))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    p = _start(tmp_path_factory.mktemp("hostile"), HOSTILE.format(repo=str(REPO)), "hostile")
    try:
        assert p.wait_ready(60)["config"]["vocab_size"] == 2048
        yield p
    finally:
        p.close()


def _mode(p: served.ServedProcess, mode: int, gen: int = 12) -> timed.Timed:
    body = {"op": "generate", "prompt_ids": PROMPT, "max_new": gen, "stream": "ends", "seed": mode}
    return p.request(body, 60)


def _hostile_sample(t: timed.Timed, gen: int = 12) -> ab_samples.Sample:
    return ab_sampling.sample(Side.HEAD, len(PROMPT), 0, 0, PROMPT, gen, t, stream="ends")


def test_an_engine_that_writes_past_serve_py_is_still_held_to_the_shape(hostile):
    honest = _hostile_sample(_mode(hostile, 1))
    assert [len(x) for x in _mode(hostile, 1).steps] == [1, 11]
    t = _mode(hostile, 2)  # serve.py's checks passed: it was handed one token and sent the rest itself
    assert t.tokens == honest.tokens and t.summary["n"] == 1  # the engine's count is a diagnostic only
    with pytest.raises(ab_samples.SideError, match="in 3 lines"):
        _hostile_sample(t)


def test_an_engine_that_streams_each_token_anyway_gets_the_ends_lines(hostile):
    honest = _mode(hostile, 1)
    t = _mode(hostile, 4)
    assert [len(x) for x in t.steps] == [1, 11] and t.tokens == honest.tokens
    assert _hostile_sample(t).tokens == honest.tokens


def test_an_engine_that_returns_other_tokens_than_it_streamed_is_refused(hostile):
    with pytest.raises(serve_error.ServeError, match="other tokens than it streamed"):
        _mode(hostile, 3)
    assert _mode(hostile, 1).tokens  # and it goes on


def test_what_is_audited_is_what_was_streamed_even_past_serve_py_s_check(hostile):
    honest = _mode(hostile, 1).tokens
    s = _hostile_sample(_mode(hostile, 5))  # serve.py's comparison fooled through the closure
    # the bot never asks serve.py: the tokens it keeps (and audits) are the lines it read
    assert s.tokens[0] == (honest[0] + 1) % 2048 and s.tokens[1:] == honest[1:]


@pytest.mark.timing
def test_a_decode_moved_ahead_of_the_first_token_lands_in_the_prefill(hostile):
    t = _mode(hostile, 6)  # a decode rate (a gap, not a burst), but all the real work is prefill
    s = _hostile_sample(t)
    own = t.summary["timings"]
    assert t.prefill_s >= own["prefill_s"] + own["decode_s"]  # the real decode, before the first token
    assert s.prefill_tps <= s.context / (own["prefill_s"] + own["decode_s"])  # the guarded metric pays
    assert t.prefill_s + t.decode_s == pytest.approx((t.arrivals_ns[-1] - t.sent_ns) / 1e9)


# ------------------------------------------------------------------ the prompt in two parts (#36 part 4)


def _prefill(p: served.ServedProcess) -> timed.Timed:
    return p.request({"op": "prefill", "prompt_ids": PROMPT}, 60)


def _continued(p: served.ServedProcess, mode: int, token: int, gen: int = 12) -> timed.Timed:
    body = {"op": "generate", "continue": True, "prompt_ids": [token], "max_new": gen, "stream": "ends"}
    return p.request({**body, "seed": mode}, 60)


@pytest.mark.timing
def test_in_two_parts_a_decode_moved_ahead_of_the_first_token_stays_on_the_decode_clock(hostile):
    """The attack of the one-part test above, against the two-part clock: the whole decode is done before
    the first token line again, and every bit of it is decode, since the clock starts when the harness
    sends the continuation it depends on."""
    pre = _prefill(hostile)
    t = _continued(hostile, 6, 99)
    s = ab_sampling.sample(Side.HEAD, len(PROMPT), 0, 0, [*PROMPT, 99], 12, t, stream="ends", prefill=pre)
    own = t.summary["timings"]
    assert s.decode_s >= own["prefill_s"] + own["decode_s"] + 0.05  # the engine's work and its gap
    assert s.prefill_tps == pytest.approx(len(PROMPT) / pre.answer_s)
    # and the tokens are the whole prompt's: what the audit checks against the reference
    whole = hostile.request(
        {"op": "generate", "prompt_ids": [*PROMPT, 99], "max_new": 12, "stream": "ends", "seed": 1}, 60
    )
    assert s.tokens == whole.tokens


def test_a_prefill_that_answers_tokens_is_refused(fake):
    p = fake(
        """
        for line in sys.stdin:
            req = json.loads(line)
            send({"id": req["id"], "tok": 5})
            send({"id": req["id"], "event": "done", "n": 1})
        """
    )
    pre = p.request({"op": "prefill", "prompt_ids": [1, 2, 3]}, 10)
    with pytest.raises(ab_samples.SideError, match="prefill request answered 1 tokens"):
        ab_sampling.sample(Side.HEAD, 3, 0, 0, [1, 2, 3, 4], 1, pre, stream="ends", prefill=pre)


TWO_PART = """
for line in sys.stdin:
    req = json.loads(line)
    if req.get("op") == "shutdown":
        break
    rid = req["id"]
    if req["op"] == "prefill":
        burn(PREFILL_S)
        send({"id": rid, "event": "done", "n": len(req["prompt_ids"])})
        continue
    assert req.get("continue") is True and len(req["prompt_ids"]) == 1, req
    n = req["max_new"]
    burn(AHEAD_S)  # before the first token line: in one part this was prefill
    send({"id": rid, "tok": 1})
    burn(0.02)
    send({"id": rid, "toks": [2] * (n - 1)})
    send({"id": rid, "event": "done", "n": n, "t": req["prompt_ids"][0]})
"""


def _two_part(tmp: Path, label: str, ops: list[str] | None) -> served.ServedProcess:
    head = textwrap.dedent(f"""
        import json, sys, time
        PREFILL_S, AHEAD_S = 0.05, 0.03
        def send(o):
            sys.stdout.write(json.dumps(o) + "\\n"); sys.stdout.flush()
        def burn(s):  # work, not a sleep: a frozen process makes no progress on it
            t = time.thread_time() + s
            while time.thread_time() < t:
                pass
        ready = {{"event": "ready", "protocol": "evalbot.serve/1", "config": {{"vocab_size": 100}}}}
        if {ops!r} is not None:
            ready["ops"] = {ops!r}
        send(ready)
    """)
    p = _start(tmp, head + textwrap.dedent(TWO_PART), label)
    p.wait_ready(10)
    return p


@pytest.mark.parametrize("sliced", [None, 0.01])
def test_a_pair_in_two_parts_draws_one_continuation_after_both_prefills_and_clocks_decode_from_it(
    tmp_path, sliced
):
    procs = {
        Side.BASE: _two_part(tmp_path, "main", ["generate", "prefill", "score"]),
        Side.HEAD: _two_part(tmp_path, "pr", ["generate", "prefill"]),
    }
    try:
        assert ab_twopart.two_part(procs)
        prompts = ab_samples.Prompts(lambda ctx, i: [i % 100] * ctx)
        run = ab_samples.Run()
        quiet = Quiet(max_other_cores=2.0, sample_s=0.05, max_wait_s=1)
        out = abtest._pair(
            procs, 0, 0, 5, prompts, 4, 10, quiet, False, lambda m: None, run,
            stream="ends", slice_s=sliced, two=True,
        )  # fmt: skip
        assert len(out) == 2
        tails = {s.prompt[-1] for s in out}
        assert len(tails) == 1 and all(len(s.prompt) == 6 for s in out)  # one continuation, after the prompt
        for s in out:
            assert s.context == 5 and s.decode_steps == 4
            assert s.decode_s >= 0.05  # the 30 ms before the first token line is decode, not prefill
            assert 5 / s.prefill_tps >= 0.05
    finally:
        for p in procs.values():
            p.close()


def test_where_main_answers_prefill_the_pr_must_too_and_where_it_does_not_one_part_is_said(tmp_path):
    both = {
        Side.BASE: served.ServedProcess("main", None, ready={"ops": ["generate", "prefill"]}),
        Side.HEAD: served.ServedProcess("pr", None, ready={"ops": ["generate"]}),
    }
    with pytest.raises(ab_samples.SideError, match="does not list it") as err:
        ab_twopart.two_part(both)
    assert err.value.side is Side.HEAD and err.value.stage == "protocol"
    # the PR cannot choose the clock: what main's engine answers decides it
    one = {
        Side.BASE: served.ServedProcess("main", None, ready={}),
        Side.HEAD: served.ServedProcess("pr", None, ready={"ops": ["generate", "prefill"]}),
    }
    assert ab_twopart.two_part(one) is False
    garbage = {
        Side.BASE: served.ServedProcess("main", None, ready={"ops": ["generate", "prefill"]}),
        Side.HEAD: served.ServedProcess("pr", None, ready={"ops": "prefill"}),
    }
    with pytest.raises(ab_samples.SideError):
        ab_twopart.two_part(garbage)


def test_the_continuation_is_drawn_from_the_smallest_vocabulary_and_is_not_the_seeded_prompts():
    procs = {
        Side.BASE: served.ServedProcess("main", None, vocab=50),
        Side.HEAD: served.ServedProcess("pr", None, vocab=40_000),
    }
    draws = {ab_twopart.continuation(procs) for _ in range(400)}
    assert max(draws) < 50 and len(draws) > 30


# ------------------------------------------------------------------ the verdict: time moved to prefill

PROV = Provenance("repo", "a" * 40, "b" * 40, "a" * 40, "0" * 64, "cuda")
CTX = 32768  # a context whose prefill takes about as long as the 128-token decode (an estimate for the H200)


def _verdict(
    head: tuple[float, float],
    base: tuple[float, float] = (0.60, 0.75),
    seed: int = 0,
    prefill_noise: float = 5e-4,
):
    """The verdict on A/B pairs whose harness clocks read (prefill_s, decode_s) per side, gpu profile's
    ends stream and design (8 blocks of 8 pairs, 0.05% request noise, a 0.1% process offset per block);
    `prefill_noise`, the prefill's own request noise (sd, a fraction)."""
    rules = load_rules(default_rules_dir())
    gpu = next(p for p in rules.profiles if p.name == "gpu")
    profile = dataclasses.replace(gpu, contexts=tuple(c for c in gpu.contexts if c.ctx == CTX))
    gen = gpu.measurement.decode_tokens
    rng, prompt, samples = random.Random(seed), [1] * CTX, []
    for block in range(8):
        offset = {side: 1 + rng.gauss(0, 1e-3) for side in Side if side is not Side.HARNESS}
        for i in range(8):
            for side, (pre, dec) in ((Side.BASE, base), (Side.HEAD, head)):
                pre *= offset[side] * (1 + rng.gauss(0, prefill_noise))
                dec *= offset[side] * (1 + rng.gauss(0, 5e-4))
                t = timed.Timed(
                    {"op": "generate", "stream": "ends"},
                    0,
                    tuple(range(gen)),
                    (int(pre * 1e9), int((pre + dec) * 1e9)),
                    ((0,), tuple(range(1, gen))),
                    {"n": gen},
                )
                samples.append(
                    ab_sampling.sample(
                        side, CTX, block, i, prompt, gen, t, base_first=block % 2 == 0, stream="ends"
                    )
                )
    return decide(Measurements(PROV, throughput=tuple(ab_samples.throughput(samples, profile, "m"))), rules)


def test_a_decode_moved_into_the_prefill_is_rejected_as_a_prefill_regression():
    assert _verdict((0.60, 0.75)).status is Status.PASS and _verdict((0.60, 0.75)).tier is None  # A/A
    moved = _verdict((0.60 + 0.075, 0.75 - 0.075))  # a tenth of the decode held back before the first token
    decode = next(e for e in moved.estimates if e.metric == "decode_tps")
    assert decode.ratio == pytest.approx(1 / 0.9, rel=2e-3)  # what the shift alone would have claimed
    assert moved.status is Status.REJECT and "regression" in moved.labels_add
    assert any(e.metric == "prefill_tps" and e.regression for e in moved.estimates)


@pytest.mark.xfail(
    strict=True,
    reason="HOLE of the one-part clock (engines whose ready line lists no 'prefill' op; the two-part "
    "clock, tested above, leaves no decode step before the decode clock): the engine decides where "
    "prefill ends and decode begins, and the "
    "prefill guard (no_regression 0.98) lets up to ~2% of the prefill time move into it unseen. Where the "
    "prefill is as long as the decode (32k on the H200, by estimate), a real +0.8% decode gain plus "
    "1.8% of the prefill "
    "held back before the first token reads +2.3% and earns XS. Charging each side's prefill excess over "
    "the other's to its decode (pair by pair) would close it but import the prefill's noise into the "
    "decode: on the H200 the harness-timed prefill at 4k moved by up to 60 ms between the two sides of a "
    "pair, against a decode pair sd of 0.4 ms (docs/benchmarks.md). Open: a tighter prefill guard where "
    "decode scores, or a prefill clock as quiet as the decode's.",
)
def test_a_shift_inside_the_prefill_guard_buys_no_tier():
    real = 0.75 / 1.008  # a real +0.8% decode gain: no tier on its own
    honest = _verdict((0.60, real))
    assert honest.status is Status.PASS and honest.tier is None
    shifted = _verdict((0.60 * 1.018, real - 0.60 * 0.018))
    assert shifted.status is Status.PASS  # the prefill guard does not see 1.8%
    assert shifted.tier == honest.tier


@pytest.mark.xfail(
    strict=True,
    reason="HOLE of the one-part clock, measured (#36 part 4; closed where main's engine answers "
    "'prefill', as this repository's does): on the H100 the harness-timed prefill moves 13% (16k) to 22% (4k) "
    "request to request, both sides alike (the A/A workflow call of 2026-12-06, "
    "docs/results/gpu_workflow_h100_2026-12-06/call3_aa_by_merge/result.json), against 0.1-0.3% for "
    "the decode. The prefill guard then cannot see a shift of 5-10% of the prefill: with the shipped "
    "design (64 pairs) it reads +4% decode and earns S in 5 seeds of 5, 10% earns M. Open: a prefill "
    "clock as quiet as the decode's (what moves it is not yet measured), or a protocol where the decode "
    "depends on something the harness sends only once the prefill is done (a continuation token), so no "
    "decode step can be computed before the decode clock starts: built (ab_twopart.two_part).",
)
def test_with_the_gpus_measured_prefill_noise_a_shift_of_five_percent_of_the_prefill_buys_no_tier():
    for seed in range(3):
        honest = _verdict((0.60, 0.75), seed=seed, prefill_noise=0.13)
        assert honest.status is Status.PASS and honest.tier is None
        shifted = _verdict((0.60 * 1.05, 0.75 - 0.60 * 0.05), seed=seed, prefill_noise=0.13)
        assert shifted.tier is None, f"seed {seed}: {shifted.status.name} {shifted.tier}"


# ------------------------------------------------------------------ the audit: wrong tokens that pass


def test_a_token_the_reference_finds_unlikely_is_no_near_tie():
    s = ab_samples.Sample(Side.HEAD, 3, 0, 0, (1, 2, 3), (5, 1999), 1.0, 1.0, {})
    answer = {"argmax": [5, 7], "margin": [0.4, 0.3], "logprob": [-6.0, -30.0], "top1": [-6.0, -6.1]}
    (got,) = audit.judge("m", "main", [s], {audit.key(s): answer}, near_tie=1.0)
    assert got.violations == 1  # token 1999 is 24 nats below the reference's choice
    assert got.worst[0]["margin"] == pytest.approx(23.9) and got.near_ties == 0
    # an honest near-tie (the token 0.2 below the top-1) is still excused, and so is llama.cpp's gap
    honest = {"argmax": [5, 7], "margin": [0.4, 0.3], "logprob": [-6.0, -6.3], "top1": [-6.0, -6.1]}
    (ok,) = audit.judge("m", "main", [s], {audit.key(s): honest}, near_tie=1.0)
    assert ok.violations == 0 and ok.near_ties == 1
    llama = {"argmax": [5, 7], "margin": [0.4, 0.3], "gap": [0.0, 5.5]}
    (far,) = audit.judge("m", "llama.cpp", [s], {audit.key(s): llama}, near_tie=1.0)
    assert far.violations == 1 and far.worst[0]["margin"] == 5.5
