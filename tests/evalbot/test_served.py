"""The served protocol from the harness's side: its own clock, every line checked, the idle side frozen.

Real processes throughout: the fixture engine's `serve`, and small stand-in servers that misbehave the
ways a PR's engine could (garbage, floods, silence, bursts, busy threads)."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from evalbot.evaluate import (
    ab_samples,
    ab_sampling,
    box,
    sandbox,
    schedule,
    serve_error,
    served,
    stamped,
    timed,
)
from evalbot.model import Side
from tests.fixtures import fixture_engine_branches as fb

pytestmark = pytest.mark.timing  # times work: runs alone, after the rest (make test)

PY = sys.executable


def _spec(tmp: Path, cap: int = 1 << 20) -> sandbox.SandboxSpec:
    return sandbox.SandboxSpec(
        ro_binds=(),
        scratch=tmp,
        workdir=tmp,
        env={"PATH": os.environ["PATH"]},
        limits=sandbox.Limits(max_output_bytes=cap, timeout_s=60),
    )


def _fake(tmp: Path, body: str, cap: int = 1 << 20) -> served.ServedProcess:
    script = tmp / "fake.py"
    script.write_text(
        textwrap.dedent("""
        import json, sys, threading, time
        def send(o):
            sys.stdout.write(json.dumps(o) + "\\n"); sys.stdout.flush()
        send({"event": "ready", "protocol": "evalbot.serve/1", "config": {"vocab_size": 100}})
    """)
        + textwrap.dedent(body)
    )
    return served.ServedProcess.start("fake", _spec(tmp, cap), [PY, str(script)], no_sandbox=True)


@pytest.fixture(scope="module")
def fixture_model(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("fx-cache")
    proc = subprocess.run(
        [PY, "-m", "engine.registry", "fetch", fb.MODEL_NAME],
        cwd=fb.TEMPLATE,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "XDG_CACHE_HOME": str(cache)},
    )
    return Path(proc.stdout.strip().splitlines()[-1])


def test_the_harness_times_a_real_serving_engine(tmp_path, fixture_model):
    argv = [PY, "-m", "engine", "serve", "--model", str(fixture_model), "--max-seq", "200"]
    spec = sandbox.SandboxSpec(
        ro_binds=(fb.TEMPLATE,),
        scratch=tmp_path,
        workdir=fb.TEMPLATE,
        env={"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1"},
        limits=sandbox.Limits(timeout_s=60),
    )
    p = served.ServedProcess.start("fixture", spec, argv, no_sandbox=True)
    try:
        ready = p.wait_ready(30)
        assert ready["protocol"] == "evalbot.serve/1" and p.vocab == 256
        t = p.request({"op": "generate", "prompt_ids": list(range(1, 65)), "max_new": 16}, 30)
        assert len(t.tokens) == 16 and len(t.arrivals_ns) == 16 and t.summary["n"] == 16
        assert t.prefill_s > 0 and t.decode_s > 0 and t.decode_tps > 0
        assert list(t.arrivals_ns) == sorted(t.arrivals_ns)  # the harness's own monotonic clock
        ids = p.request({"op": "tokenize", "text": "abc"}, 30).summary["ids"]
        assert ids == [97, 98, 99]
        scored = p.request({"op": "score", "ids": [*range(1, 65), *t.tokens], "from": 64}, 30).summary
        assert scored["argmax"][:3] == list(t.tokens[:3])  # greedy tokens are the model's own top-1
        with pytest.raises(serve_error.ServeError, match="refused request"):
            p.request({"op": "generate", "prompt_ids": [999], "max_new": 2}, 30)
        assert p.request({"op": "generate", "prompt_ids": [1, 2], "max_new": 2}, 30).tokens  # it goes on
    finally:
        p.close()


@pytest.mark.parametrize(
    ("body", "stage", "words"),
    [
        ('print("plain text, not the protocol", flush=True)\ntime.sleep(30)', "protocol", "not the protocol"),
        ("send([1, 2])\ntime.sleep(30)", "protocol", "not an object"),
        ('sys.stderr.write("x" * 4096 * 1024); sys.stderr.flush()\ntime.sleep(30)', "output", "stopped"),
        ("time.sleep(30)", "timeout", "no answer within"),
        ("sys.exit(7)", "run", "exited with code 7"),
        (
            'line = sys.stdin.readline(); send({"id": "someone-else", "tok": 1})\ntime.sleep(30)',
            "serve",
            "a line for",
        ),
        (
            'line = sys.stdin.readline(); send({"id": json.loads(line)["id"], "tok": 100})\ntime.sleep(30)',
            "serve",
            "not a token line",
        ),
    ],
)
def test_a_misbehaving_server_is_stopped_with_the_reason(tmp_path, body, stage, words):
    p = _fake(tmp_path, body)
    try:
        p.wait_ready(10)
        with pytest.raises(serve_error.ServeError) as info:
            p.request({"op": "generate", "prompt_ids": [1], "max_new": 4}, 2)
        assert info.value.stage == stage and words in str(info.value)
        assert p.broken
    finally:
        t0 = time.monotonic()
        p.close()
        closed_s = time.monotonic() - t0
    assert p.proc.poll() is not None
    assert closed_s < 3, f"close() waited {closed_s:.1f} s on a server that broke the protocol"


def test_a_late_reader_keeps_each_lines_write_time(tmp_path):
    """The kernel stamps each write: while the harness's reader is held up (a busy GIL or core) the engine
    writes a token every 20 ms, and once the reader runs again the lines keep their 20 ms apart, where a
    pipe read late gave them all one time (an honest fast engine's tokens then read as a burst)."""
    p = _fake(tmp_path, textwrap.dedent("""
        line = json.loads(sys.stdin.readline())
        for t in range(5):
            send({"id": line["id"], "tok": t}); time.sleep(0.02)
        send({"id": line["id"], "event": "done", "n": 5})
    """) + UNTIL_SHUTDOWN)  # fmt: skip
    try:
        p.wait_ready(10)
        with p._read_lock:  # the reader cannot take a byte while this is held
            pending = p.begin({"op": "generate", "prompt_ids": [1], "max_new": 5}, 10)
            time.sleep(0.4)  # the engine writes all five tokens and its summary meanwhile
            assert p.lines.empty()
        done = pending.collect()
        assert done is not None and done.tokens == (0, 1, 2, 3, 4)
        gaps_ms = [(b - a) / 1e6 for a, b in zip(done.arrivals_ns, done.arrivals_ns[1:], strict=False)]
        assert all(15 < g < 200 for g in gaps_ms), gaps_ms
        assert done.arrivals_ns[0] - done.sent_ns < 300e6  # the first token's write, not the late read
    finally:
        p.close()


def test_a_write_past_what_one_message_holds_fails_the_side_with_the_reason(tmp_path):
    p = _fake(tmp_path, """
        line = json.loads(sys.stdin.readline())
        send({"id": line["id"], "tok": 1, "pad": "x" * (8 << 20)})
    """)  # fmt: skip
    try:
        p.wait_ready(10)
        assert p.out is not None and p.out.stamped and p.out.max_message >= 200 << 10
        with pytest.raises(serve_error.ServeError) as info:
            p.request({"op": "generate", "prompt_ids": [1], "max_new": 1}, 10)
        assert "one write()" in str(info.value) and "Message too long" in info.value.tail
    finally:
        p.close()


def test_empty_writes_are_nothing_and_a_flood_of_them_is_stopped(tmp_path):
    p = _fake(tmp_path, """
        import os
        line = json.loads(sys.stdin.readline())
        os.write(1, b""); os.write(1, b"")
        send({"id": line["id"], "tok": 1}); send({"id": line["id"], "event": "done", "n": 1})
        line = json.loads(sys.stdin.readline())
        while True:
            os.write(1, b"")
    """)  # fmt: skip
    try:
        p.wait_ready(10)
        done = p.request({"op": "generate", "prompt_ids": [1], "max_new": 1}, 10)
        assert done.tokens == (1,)
        with pytest.raises(serve_error.ServeError) as info:
            p.request({"op": "generate", "prompt_ids": [1], "max_new": 1}, 10)
        assert info.value.stage == "output" and "empty writes" in str(info.value)
    finally:
        p.close()


def test_a_file_descriptor_sent_along_a_line_never_reaches_the_harness(tmp_path):
    """The engine's stdout is a socket, so it could pass descriptors (SCM_RIGHTS) to the harness, filling its
    table or handing it a file: the harness's ancillary buffer holds the kernel's stamp only, and the
    descriptors are never installed. The line itself is read as any other."""
    before = len(os.listdir("/proc/self/fd"))
    p = _fake(tmp_path, textwrap.dedent("""
        import array, os, socket
        out = socket.socket(fileno=os.dup(1))
        line = json.loads(sys.stdin.readline())
        fds = array.array("i", [os.open("/dev/null", os.O_RDONLY) for _ in range(50)])
        data = (json.dumps({"id": line["id"], "tok": 1}) + "\\n").encode()
        out.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())])
        send({"id": line["id"], "event": "done", "n": 1})
    """) + UNTIL_SHUTDOWN)  # fmt: skip
    try:
        p.wait_ready(10)
        done = p.request({"op": "generate", "prompt_ids": [1], "max_new": 1}, 10)
        assert done.tokens == (1,)
        # the fake's own pipes (stdin, stderr) and the socket: nothing of the 50 it sent
        assert len(os.listdir("/proc/self/fd")) <= before + 4
    finally:
        p.close()


def test_an_arrival_is_the_kernels_stamp_kept_between_the_previous_line_and_the_read():
    stamp = [(socket.SOL_SOCKET, stamped.SO_TIMESTAMPNS, struct.pack("@qq", 100, 500))]
    real = 100 * 10**9 + 500 + 7_000  # read 7 µs after the write
    assert stamped.arrival_ns(stamp, 1_000_000, real, 0) == 1_000_000 - 7_000
    assert stamped.arrival_ns(stamp, 1_000_000, real, 995_000) == 995_000  # never before the previous line
    assert (
        stamped.arrival_ns(stamp, 1_000_000, real - 9_000, 0) == 1_000_000
    )  # a clock step: never after the read
    assert stamped.arrival_ns([], 1_000_000, real, 0) == 1_000_000  # no stamp: the read time


# like the real engine, the fakes below that read nothing else end on the shutdown request (close() gives
# a process that ignores it 5 s before ending its tree)
UNTIL_SHUTDOWN = """
for line in sys.stdin:
    if '"shutdown"' in line:
        sys.exit(0)
"""
BUSY = (
    """
def spin():
    while True:
        pass
for _ in range(2):
    threading.Thread(target=spin, daemon=True).start()
"""
    + UNTIL_SHUTDOWN
)


def test_a_frozen_side_uses_no_cpu_and_resumes_when_thawed(tmp_path):
    p = _fake(tmp_path, BUSY)
    try:
        p.wait_ready(10)
        time.sleep(0.3)
        p.freeze()
        mine = box.measure(p.proc.pid, 1.0, with_gpu=False)
        assert mine.own_cores < 0.1, mine  # stopped: its spinning threads get no CPU
        p.thaw()
        running = box.measure(p.proc.pid, 1.0, with_gpu=False)
        assert running.own_cores > 0.5, running
    finally:
        p.close()


def test_run_alone_freezes_every_other_side_while_one_is_timed(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = _fake(tmp_path / "a", BUSY)
    b = _fake(
        tmp_path / "b",
        'line = sys.stdin.readline(); rid = json.loads(line)["id"]\n'
        'send({"id": rid, "tok": 1}); send({"id": rid, "tok": 2})\n'
        'send({"id": rid, "event": "done", "n": 2})\n' + UNTIL_SHUTDOWN,
    )
    try:
        a.wait_ready(10)
        b.wait_ready(10)
        seen = {}

        def call():
            seen["a_usage"] = box.measure(a.proc.pid, 0.5, with_gpu=False).own_cores
            return b.request({"op": "generate", "prompt_ids": [1], "max_new": 2}, 10)

        t = schedule.run_alone(b, [a], call)
        assert t.tokens == (1, 2) and a.frozen and b.frozen and seen["a_usage"] < 0.1
    finally:
        a.close()
        b.close()


def _timed(n: int, gap_ns: int, first_after_ns: int = 1_000_000) -> timed.Timed:
    arrivals = tuple(first_after_ns + i * gap_ns for i in range(n))
    return timed.Timed(
        {"op": "generate"},
        0,
        tuple(range(n)),
        arrivals,
        tuple((i,) for i in range(n)),
        {"n": n, "timings": {"decode_s": 0.001}},
    )


def test_tokens_streamed_in_a_burst_are_refused_and_burst_time_counts_as_prefill():
    burst = _timed(32, gap_ns=200)  # 200 ns apart: computed before the first was sent
    assert burst.decode_tps > ab_sampling.MAX_DECODE_TPS
    with pytest.raises(ab_samples.SideError, match="burst"):
        ab_sampling.sample(Side.HEAD, 128, 0, 0, [1] * 128, 32, burst)
    honest = _timed(32, gap_ns=20_000_000, first_after_ns=50_000_000)
    s = ab_sampling.sample(Side.HEAD, 128, 0, 0, [1] * 128, 32, honest)
    assert s.decode_tps == pytest.approx(31 / (31 * 0.02)) and s.prefill_tps == pytest.approx(128 / 0.05)
    assert s.self_report_gap == pytest.approx(abs(0.001 - 0.62) / 0.62)


def test_a_side_that_streams_fewer_or_grouped_tokens_is_refused():
    grouped = timed.Timed(
        {"op": "generate"}, 0, tuple(range(8)), (1_000_000, 9_000_000), ((0, 1, 2, 3), (4, 5, 6, 7)), {"n": 8}
    )
    with pytest.raises(ab_samples.SideError, match="one line per token"):
        ab_sampling.sample(Side.HEAD, 128, 0, 0, [1] * 128, 8, grouped)
    with pytest.raises(ab_samples.SideError, match="streamed 8"):
        ab_sampling.sample(Side.HEAD, 128, 0, 0, [1] * 128, 16, grouped)


def _ends(n: int, decode_ns: int) -> timed.Timed:
    return timed.Timed(
        {"op": "generate", "stream": "ends"},
        0,
        tuple(range(n)),
        (50_000_000, 50_000_000 + decode_ns),
        ((0,), tuple(range(1, n))),
        {"n": n},
    )


def test_the_ends_stream_is_timed_first_line_to_last_and_nothing_else_passes_for_it():
    s = ab_sampling.sample(Side.HEAD, 128, 0, 0, [1] * 128, 32, _ends(32, 310_000_000), stream="ends")
    assert s.decode_tps == pytest.approx(31 / 0.31) and s.prefill_tps == pytest.approx(128 / 0.05)
    # the decode computed during the prefill, sent at once: a burst, never a rate
    with pytest.raises(ab_samples.SideError, match="burst"):
        ab_sampling.sample(Side.HEAD, 128, 0, 0, [1] * 128, 32, _ends(32, 300), stream="ends")
    # a line per token where the ends were asked for (or everything in one line): refused, not averaged
    with pytest.raises(ab_samples.SideError, match="the first token, then the rest"):
        ab_sampling.sample(Side.HEAD, 128, 0, 0, [1] * 128, 32, _timed(32, 20_000_000), stream="ends")
    one = timed.Timed({"op": "generate"}, 0, tuple(range(32)), (9_000_000,), (tuple(range(32)),), {"n": 32})
    with pytest.raises(ab_samples.SideError, match="in 1 lines"):
        ab_sampling.sample(Side.HEAD, 128, 0, 0, [1] * 128, 32, one, stream="ends")


def test_frozen_time_inside_a_request_is_not_the_engines():
    """Prefill and decode spans lose the time the harness kept the process frozen, and only that."""
    t = timed.Timed(
        {"op": "generate"},
        0,
        (1, 2, 3),
        (10_000_000, 20_000_000, 30_000_000),
        ((1,), (2,), (3,)),
        {"n": 3},
        paused_ns=((2_000_000, 6_000_000), (12_000_000, 15_000_000), (28_000_000, 40_000_000)),
    )
    assert t.prefill_s == pytest.approx((10 - 4) / 1e3)  # 4 ms of the 10 before the first token frozen
    assert t.decode_s == pytest.approx((20 - 3 - 2) / 1e3)  # 3 ms inside, 2 ms of the last pause inside
    assert t.decode_tps == pytest.approx(2 / 0.015)


# a fake engine whose every token is a fixed amount of CPU work, streamed a line at a time
WORKER = """
for line in sys.stdin:
    req = json.loads(line)
    if req.get("op") == "shutdown":
        sys.exit(0)
    if req.get("die"):
        sys.exit(3)
    for i in range(req["max_new"]):
        n = 0
        for _ in range(200_000):
            n += 1
        send({"id": req["id"], "tok": i % 100})
    send({"id": req["id"], "event": "done", "n": req["max_new"]})
"""


def test_a_sliced_pair_runs_both_requests_in_turns_and_times_each_without_the_others(tmp_path):
    """Two engines answer in alternating 50 ms slices: each side's decode time is its own work (about its
    time alone, not the two requests' wall time), the pauses are recorded, and nothing runs together."""
    for d in "abc":
        (tmp_path / d).mkdir()
    a, b = _fake(tmp_path / "a", WORKER), _fake(tmp_path / "b", WORKER)
    c = _fake(tmp_path / "c", BUSY)  # a third process (e.g. a spinning PR): frozen the whole time
    body = {"op": "generate", "prompt_ids": [1], "max_new": 30}
    try:
        for p in (a, b, c):
            p.wait_ready(10)
        alone = [schedule.run_alone(p, [q, c], lambda p=p: p.request(body, 30)) for p, q in ((a, b), (b, a))]
        c_before = _cpu_ticks(c.proc.pid)
        t0 = time.monotonic()
        sliced = schedule.run_sliced([a, b], [c], body, 0.05, 30)
        wall = time.monotonic() - t0
        assert a.frozen and b.frozen and c.frozen
        assert _cpu_ticks(c.proc.pid) - c_before <= 2  # at most a tick or two of accounting noise
        for one, two in zip(alone, sliced, strict=True):
            assert two.tokens == one.tokens and len(two.paused_ns) >= 2
            # its own work, give or take the box: far from the ~2x that the other's slices would add
            assert 0.6 < two.decode_s / one.decode_s < 1.5, (one.decode_s, two.decode_s)
        assert wall > 1.6 * max(t.decode_s for t in sliced)  # the two really took turns
    finally:
        for p in (a, b, c):
            p.close()


def _cpu_ticks(pid: int) -> int:
    """utime + stime of one process and its threads, in clock ticks (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def test_a_sliced_pair_names_the_side_that_failed(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = _fake(tmp_path / "a", WORKER), _fake(tmp_path / "b", WORKER)
    try:
        a.wait_ready(10)
        b.wait_ready(10)
        with pytest.raises(schedule.SliceError) as err:
            schedule.run_sliced(
                [a, b], [], {"op": "generate", "prompt_ids": [1], "max_new": 30, "die": 1}, 0.05, 30
            )
        assert err.value.which == 0 and err.value.stage == "run"
        assert a.broken and not b.broken
    finally:
        a.close()
        b.close()


def test_an_engines_own_clock_is_news_only_where_the_prs_disagrees_and_mains_agrees():
    """Frozen turns put every engine's own decode time far from the harness's: a note saying so about main
    (on every report) alarms and decides nothing. Only the PR's clock disagreeing alone is noted."""
    from evalbot.evaluate.served_model import _diagnostics

    def side(which: Side, reported_s: float) -> ab_samples.Sample:
        t = _timed(32, gap_ns=20_000_000, first_after_ns=50_000_000)  # 0.62 s of decode by the harness
        t = timed.Timed(
            t.request,
            t.sent_ns,
            t.tokens,
            t.arrivals_ns,
            t.steps,
            {"n": 32, "timings": {"decode_s": reported_s}},
        )
        return ab_sampling.sample(which, 128, 0, 0, [1] * 128, 32, t)

    both_off = [side(Side.BASE, 0.3), side(Side.HEAD, 0.3)]
    assert _diagnostics(both_off, 0.2) == []
    head_off = [side(Side.BASE, 0.62), side(Side.HEAD, 0.3)]
    [note] = _diagnostics(head_off, 0.2)
    assert note.startswith("the PR's engine reports decode times 52% away") and "main's agree" in note
