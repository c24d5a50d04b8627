"""The GPU idle probe (#36 part 5): freezing an engine stops its host processes, not the kernels it queued
on the device, so after every freeze the harness asks a trusted probe (`gpu_probe.py`, through
`device_idle.Probe`) how long the device stays busy, and the request the frozen engine answered ends when
the device is idle (`Timed.device_idle_ns`); past `DRAIN_LIMIT_S` the side fails (stage 'frozen').

This box has no GPU, so the device is played by a test double that behaves like the real one: a file
holding the monotonic time (ns, CLOCK_MONOTONIC: the same clock in every process) until which queued work
runs. Stand-in engines queue work by writing to it (after whatever is queued already), and wait on it
before their own work (one device, shared); the stand-in probe (`PROBE_DOUBLE`) runs the real
`gpu_probe.drain` over round trips that take a time slice while the file says the device is busy, and
speaks the real probe's protocol. As on a real device, work queued by a process that has ended is gone
with its context. The red team's attack through a whole pair is in
test_two_part_redteam.py; it uses the double from here.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from evalbot.evaluate import (
    ab_block,
    ab_samples,
    ab_twopart,
    abtest,
    box,
    device_idle,
    gpu_probe,
    sandbox,
    served,
)
from evalbot.evaluate.context import SideFailed
from evalbot.evaluate.served_model import _gpu_probe
from evalbot.evaluate.timed import Timed
from evalbot.model import Side
from evalbot.rules import Quiet

PY = sys.executable
MS = 1_000_000
DEVICE_ENV = "FAKE_GPU_DEVICE"

# ------------------------------------------------------------------ the pure parts of the probe


def test_quick_ns_is_three_times_the_idle_p99_or_the_median_plus_the_floor():
    # 20 µs round trips, one slow outlier in 200: the p99 is still 20 µs, so the floor decides
    idle = [20_000] * 199 + [400_000]
    assert gpu_probe.quick_ns(idle) == 20_000 + gpu_probe.MIN_QUICK_NS
    # a much slower idle device (400 µs): three times its p99
    assert gpu_probe.quick_ns([400_000] * 200) == 1_200_000
    assert gpu_probe.quick_ns([7]) == 7 + gpu_probe.MIN_QUICK_NS  # one round trip is enough


class FakeDevice:
    """Round trips of given durations on a fake clock: the clock moves by each one's duration."""

    def __init__(self, took: list[int], then: int | None = None):
        self.took, self.then, self.now, self.calls = list(took), then, 1_000, 0

    def clock(self) -> int:
        return self.now

    def round_trip(self) -> int:
        self.calls += 1
        t = self.took.pop(0) if self.took else self.then
        assert t is not None, "asked for more round trips than scripted"
        self.now += t
        return t


QUICK = 200_000
SLOW = 2 * MS


def test_drain_busy_then_idle_reports_when_the_last_slow_round_trip_ended():
    dev = FakeDevice([SLOW, SLOW, SLOW, 10_000, 10_000, 10_000])
    got = gpu_probe.drain(dev.round_trip, dev.clock, QUICK, 100 * MS)
    assert got == {"idle": True, "busy_ns": 3 * SLOW, "probes": 6, "slowest_ns": SLOW}


def test_drain_of_an_idle_device_is_idle_at_once():
    dev = FakeDevice([10_000, 12_000, 11_000, 10_000])
    got = gpu_probe.drain(dev.round_trip, dev.clock, QUICK, 100 * MS)
    assert got == {"idle": True, "busy_ns": 0, "probes": 3, "slowest_ns": 12_000}
    assert dev.calls == 3  # `confirm` quick ones in a row, no more


def test_drain_of_a_device_that_stays_busy_is_not_idle_at_the_limit():
    dev = FakeDevice([], then=SLOW)
    got = gpu_probe.drain(dev.round_trip, dev.clock, QUICK, 20 * MS)
    assert got["idle"] is False
    assert got["busy_ns"] == 20 * MS and got["probes"] == 10 and got["slowest_ns"] == SLOW


def test_a_quick_round_trip_between_slow_ones_is_not_idle():
    """A round trip that slipped into the idle gap between two of the busy context's slices is quick; one
    (or two) of those do not make the device idle, and the busy time runs to the slow one after them."""
    dev = FakeDevice([SLOW, 10_000, SLOW, 10_000, 10_000, SLOW, 10_000, 10_000, 10_000])
    got = gpu_probe.drain(dev.round_trip, dev.clock, QUICK, 100 * MS)
    assert got["idle"] is True and got["probes"] == 9
    assert got["busy_ns"] == 3 * SLOW + 3 * 10_000  # the end of the third slow one
    # never three quick ones in a row: not idle, whatever the share of quick ones
    dev = FakeDevice([SLOW, 10_000, 10_000] * 4)
    got = gpu_probe.drain(dev.round_trip, dev.clock, QUICK, 4 * (SLOW + 20_000) - 1)
    assert got["idle"] is False and got["probes"] == 12


# ------------------------------------------------------------------ the device double

# the device double, one function both stand-ins read it with
BUSY_UNTIL = """
def busy_until():
    # "until [pid]": work queued until then by that process; a process that ended took its work with it
    try:
        with open(DEVICE) as f:
            until, *owner = f.read().split()
        stat = "/proc/" + owner[0] + "/stat" if owner else ""
        if stat and (not os.path.exists(stat) or open(stat).read().rsplit(")", 1)[1].split()[0] in "ZX"):
            return 0
        return int(until)
    except (FileNotFoundError, ValueError, IndexError, OSError):
        return 0
"""

PROBE_DOUBLE = """
import json, os, sys, time
sys.path.insert(0, {probe_dir!r})
import gpu_probe  # the real drain (the probe imports nothing of evalbot)

DEVICE = os.environ[{env!r}]
IDLE_NS = 15_000  # a tiny kernel and a sync on an idle device


{busy_until}

def round_trip():
    # while another context's work is queued, our kernel waits for a time slice; else it is quick
    t0 = time.monotonic_ns()
    if busy_until() <= t0:
        return IDLE_NS
    time.sleep(SLICE_S)
    return time.monotonic_ns() - t0


def send(obj):
    sys.stdout.write(json.dumps(obj) + "\\n")
    sys.stdout.flush()


idle = [round_trip() for _ in range(gpu_probe.CALIBRATION)]
quick = gpu_probe.quick_ns(idle)
SLICE_S = max(0.002, 2 * quick / 1e9)
send({{"event": "ready", "idle_ns": sorted(idle), "quick_ns": quick}})
for line in sys.stdin:
    req = json.loads(line)
    if req.get("op") == "shutdown":
        break
    send(gpu_probe.drain(round_trip, time.monotonic_ns, quick, int(float(req["limit_ms"]) * 1e6)))
"""

# a two-part engine on the device double: its own work waits for what is queued on the device; it can
# say ready with warm-up work still queued (QUEUE_READY_MS), answer a prefill with work still queued
# (QUEUE_PREFILL_MS), or queue work after its last token and before its done line (QUEUE_LAST_MS)
ENGINE = """
import json, os, sys, time

DEVICE = os.environ["FAKE_GPU_DEVICE"]
READY_MS = float(os.environ.get("QUEUE_READY_MS", "0"))
PREFILL_MS = float(os.environ.get("QUEUE_PREFILL_MS", "0"))
LAST_MS = float(os.environ.get("QUEUE_LAST_MS", "0"))


def send(o):
    sys.stdout.write(json.dumps(o) + "\\n")
    sys.stdout.flush()


{busy_until}

def wait_device():
    while (until := busy_until()) > (now := time.monotonic_ns()):
        time.sleep((until - now) / 1e9)


def queue(ms):
    if ms:
        tmp = f"{DEVICE}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(f"{max(busy_until(), time.monotonic_ns()) + int(ms * 1e6)} {os.getpid()}")
        os.replace(tmp, DEVICE)


queue(READY_MS)
send({"event": "ready", "protocol": "evalbot.serve/1", "config": {"vocab_size": 100},
      "ops": ["generate", "prefill"]})
for line in sys.stdin:
    req = json.loads(line)
    if req.get("op") == "shutdown":
        break
    rid = req["id"]
    wait_device()
    if req["op"] == "prefill":
        queue(PREFILL_MS)
        send({"id": rid, "event": "done", "n": len(req["prompt_ids"])})
        continue
    n = req["max_new"]
    time.sleep(0.005)
    send({"id": rid, "tok": 1})
    time.sleep(0.005)
    send({"id": rid, "toks": [2] * (n - 1)})
    queue(LAST_MS)
    send({"id": rid, "event": "done", "n": n})
"""
ENGINE = ENGINE.replace("{busy_until}", BUSY_UNTIL)


def device_double(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Write the stand-in probe, make it the probe `Probe.start` runs, and return the device file (idle)."""
    probe = tmp_path / "probe_double.py"
    probe.write_text(
        textwrap.dedent(PROBE_DOUBLE).format(
            probe_dir=str(Path(gpu_probe.__file__).parent), env=DEVICE_ENV, busy_until=BUSY_UNTIL
        )
    )
    monkeypatch.setattr(device_idle, "PROBE", probe)
    device = tmp_path / "device"
    device.write_text("0")
    return device


def start_probe(device: Path) -> device_idle.Probe:
    return device_idle.Probe.start(PY, env={**os.environ, DEVICE_ENV: str(device)})


def queue_on(device: Path, ms: float) -> int:
    until = time.monotonic_ns() + int(ms * MS)
    device.write_text(str(until))
    return until


def start_engines(tmp_path: Path, device: Path, head_env: dict[str, str]) -> dict[Side, served.ServedProcess]:
    procs: dict[Side, served.ServedProcess] = {}
    try:
        for side in (Side.BASE, Side.HEAD):
            path = tmp_path / f"{side.value}.py"
            path.write_text(textwrap.dedent(ENGINE))
            env = {"PATH": os.environ["PATH"], "OMP_NUM_THREADS": "1", DEVICE_ENV: str(device)}
            if side is Side.HEAD:
                env.update(head_env)
            spec = sandbox.SandboxSpec(
                ro_binds=(), scratch=tmp_path, workdir=tmp_path, env=env,
                limits=sandbox.Limits(max_output_bytes=1 << 20, timeout_s=60),
            )  # fmt: skip
            procs[side] = served.ServedProcess.start(side.value, spec, [PY, str(path)], no_sandbox=True)
        for p in procs.values():
            p.wait_ready(10)
    except BaseException:
        for p in procs.values():
            p.close()
        raise
    return procs


class GpuPair:
    """One two-part GPU pair (main first) of the stand-in engines on the device double, every Timed the
    harness clocked kept (in order: prefills main, PR; continuations main, PR) and every drain asked."""

    def __init__(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, head_env: dict[str, str] | None = None
    ):
        monkeypatch.setattr(box, "gpu_state", lambda: None)  # never nvidia-smi
        self.device = device_double(tmp_path, monkeypatch)
        self.timed: list[Timed] = []
        self.drains: list[device_idle.Drain] = []
        real_run_alone, real_drain = abtest.run_alone, device_idle.Probe.drain

        def run_alone(*args, **kwargs):
            t = real_run_alone(*args, **kwargs)
            self.timed.append(t)
            return t

        def drain(probe, limit_s=device_idle.DRAIN_LIMIT_S):
            d = real_drain(probe, limit_s)
            self.drains.append(d)
            return d

        monkeypatch.setattr(abtest, "run_alone", run_alone)
        monkeypatch.setattr(device_idle.Probe, "drain", drain)
        self.tmp_path, self.head_env = tmp_path, head_env or {}

    def run(self, probe: bool = True) -> list[ab_samples.Sample]:
        """The pair's samples (main's, then the PR's); the probe attached to both engines unless not."""
        gpu = start_probe(self.device) if probe else None
        try:
            procs = self.procs = start_engines(self.tmp_path, self.device, self.head_env)
            try:
                for p in procs.values():
                    p.device = gpu
                assert ab_twopart.two_part(procs)
                prompts = ab_samples.Prompts(lambda ctx, i: [i % 100] * ctx)
                quiet = Quiet(max_other_cores=1e9, max_gpu_util=5, sample_s=0.01, max_wait_s=0)
                return abtest._pair(
                    procs, 0, 0, 5, prompts, 4, 10, quiet, True, lambda _m: None, ab_samples.Run(),
                    stream="ends", two=True,
                )  # fmt: skip
            finally:
                for p in procs.values():
                    p.close()
        finally:
            if gpu is not None:
                gpu.close()


def prefill_s(s: ab_samples.Sample) -> float:
    return s.context / s.prefill_tps


# ------------------------------------------------------------------ the double through the harness's Probe


def test_the_double_is_idle_at_once_on_an_idle_device(tmp_path, monkeypatch):
    device = device_double(tmp_path, monkeypatch)
    probe = start_probe(device)
    try:
        assert probe.ready["event"] == "ready" and probe.ready["quick_ns"] >= gpu_probe.MIN_QUICK_NS
        queue_on(device, -50)  # work that ended 50 ms ago
        d = probe.drain(2.0)
        assert d.idle and d.busy_ns == 0 and d.probes == gpu_probe.CONFIRM
        assert d.idle_at_ns == d.asked_ns
    finally:
        probe.close()


def test_the_double_waits_out_queued_work_and_says_how_long(tmp_path, monkeypatch):
    device = device_double(tmp_path, monkeypatch)
    probe = start_probe(device)
    try:
        until = queue_on(device, 200)
        d = probe.drain(2.0)
        assert d.idle
        assert 190 * MS <= d.busy_ns <= 400 * MS, d
        # when the device was found idle, on the harness's clock: after the queued work ended (less the
        # pipe's latency to the probe), a time slice or so later
        assert until - 5 * MS <= d.idle_at_ns <= until + 200 * MS
        assert time.monotonic_ns() >= until
        # and asked again, the device is idle at once
        again = probe.drain(2.0)
        assert again.idle and again.busy_ns == 0
    finally:
        probe.close()


def test_the_double_is_not_idle_past_the_limit(tmp_path, monkeypatch):
    device = device_double(tmp_path, monkeypatch)
    probe = start_probe(device)
    try:
        queue_on(device, 3000)
        t0 = time.monotonic()
        d = probe.drain(0.3)
        assert not d.idle and d.busy_ns >= 300 * MS
        assert time.monotonic() - t0 < 1.5  # it answers at the limit, not when the work ends
    finally:
        probe.close()


# ------------------------------------------------------------------ a GPU pair on the double


def test_an_honest_gpu_pair_finds_the_device_idle_after_every_freeze(tmp_path, monkeypatch):
    pair = GpuPair(tmp_path, monkeypatch)
    base, head = pair.run()
    assert (base.side, head.side) == (Side.BASE, Side.HEAD)
    # every request was followed by a freeze and a drain, and the device was idle each time
    assert len(pair.timed) == 4 and len(pair.drains) >= 4
    assert all(d.idle and d.busy_ns == 0 for d in pair.drains), pair.drains
    assert [t.device_idle_ns for t in pair.timed] == [0, 0, 0, 0]
    assert all(p.device_idle_ns == 0 for p in pair.procs.values())
    for s in (base, head):
        assert len(s.tokens) == 4
        assert prefill_s(s) < 0.25  # answered at once
        assert 0.005 <= s.decode_s < 0.25  # two 5 ms sleeps


def test_work_queued_after_the_last_token_is_on_the_prs_decode_clock(tmp_path, monkeypatch):
    """The PR's engine streams its last tokens and queues 300 ms of device work before its done line: the
    continuation's decode ends when the device has run it, not at its last token."""
    pair = GpuPair(tmp_path, monkeypatch, {"QUEUE_LAST_MS": "300"})
    base, head = pair.run()
    pr_continuation = pair.timed[3]
    assert pr_continuation.request.get("continue") is True
    assert pr_continuation.device_idle_ns >= pr_continuation.arrivals_ns[-1] + 290 * MS
    assert head.decode_s >= 0.3
    assert pr_continuation.to_last_s == pytest.approx(head.decode_s)
    assert head.decode_tps <= 4 / 0.3
    # main's side of the pair, before it, is untouched
    assert base.decode_s < 0.25 and pair.timed[2].device_idle_ns == 0


def test_work_queued_at_the_ready_line_fails_the_side_that_queued_it(tmp_path, monkeypatch):
    """The PR's engine says ready with 3 s of warm-up work still queued on the device; a block's start then
    freezes both engines (ab_block.start_block), and the side that keeps the device busy is the PR."""
    device = device_double(tmp_path, monkeypatch)
    probe = start_probe(device)

    def launch(side: Side) -> served.ServedProcess:
        path = tmp_path / f"{side.value}.py"
        path.write_text(textwrap.dedent(ENGINE))
        env = {"PATH": os.environ["PATH"], "OMP_NUM_THREADS": "1", DEVICE_ENV: str(device)}
        if side is Side.HEAD:
            env["QUEUE_READY_MS"] = "3000"
        spec = sandbox.SandboxSpec(
            ro_binds=(), scratch=tmp_path, workdir=tmp_path, env=env,
            limits=sandbox.Limits(max_output_bytes=1 << 20, timeout_s=60),
        )  # fmt: skip
        p = served.ServedProcess.start(side.value, spec, [PY, str(path)], no_sandbox=True)
        p.device = probe
        return p

    try:
        with pytest.raises(ab_samples.SideError) as err:
            ab_block.start_block(launch, 10, lambda _m: None)
        assert err.value.side is Side.HEAD and err.value.stage == "frozen"
    finally:
        probe.close()


# ------------------------------------------------------------------ the real probe, and probes that fail


def test_the_real_probe_on_a_box_without_cuda_fails_with_its_reason():
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        pytest.skip("this box has a CUDA device: the probe would start")
    with pytest.raises(device_idle.ProbeError) as err:
        device_idle.Probe.start(PY)
    msg = str(err.value)
    assert "exited (1)" in msg, msg
    assert "Traceback" in msg and ("CUDA" in msg or "torch" in msg), msg


def _stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    """A stand-in probe that writes its pid to a file, then runs `body`; returns that file."""
    pid = tmp_path / "probe.pid"
    script = tmp_path / "probe.py"
    script.write_text(
        "import json, os, sys, time\n"
        f"open({str(pid)!r}, 'w').write(str(os.getpid()))\n" + textwrap.dedent(body)
    )
    monkeypatch.setattr(device_idle, "PROBE", script)
    monkeypatch.setattr(device_idle, "READY_TIMEOUT_S", 0.5)
    return pid


def _gone(pid_file: Path) -> bool:
    pid = int(pid_file.read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("print('hello from a probe', flush=True)\ntime.sleep(60)\n", "the GPU idle probe wrote"),
        ("print('[1, 2]', flush=True)\ntime.sleep(60)\n", "the GPU idle probe wrote"),
        ("print(json.dumps({'event': 'hi'}), flush=True)\ntime.sleep(60)\n", "not its ready line"),
        ("time.sleep(60)\n", "did not answer within"),
        ('sys.stdout.write(\'{"event": "ready"\'); sys.stdout.flush()\ntime.sleep(60)\n', "did not answer"),
    ],
    ids=["garbage", "not-an-object", "not-ready", "silent", "half-a-line"],
)
def test_a_probe_that_does_not_start_properly_is_a_probe_error_and_is_ended(
    tmp_path, monkeypatch, body, says
):
    pid = _stand_in(tmp_path, monkeypatch, body)
    t0 = time.monotonic()
    with pytest.raises(device_idle.ProbeError, match=says):
        device_idle.Probe.start(PY)
    assert time.monotonic() - t0 < 3.0
    assert _gone(pid), "the probe process outlived its failed start"


READY_LINE = "print(json.dumps({'event': 'ready', 'idle_ns': [1], 'quick_ns': 2}), flush=True)\n"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("sys.stdin.readline()\nsys.exit(3)\n", r"exited \(3\)"),
        ("sys.stdin.readline()\nprint(json.dumps({'idle': True}), flush=True)\ntime.sleep(60)\n", "answered"),
        ("sys.stdin.readline()\nprint('nope', flush=True)\ntime.sleep(60)\n", "wrote"),
    ],
    ids=["exits", "incomplete-answer", "garbage-answer"],
)
def test_a_probe_that_fails_a_drain_is_a_probe_error(tmp_path, monkeypatch, body, says):
    _stand_in(tmp_path, monkeypatch, READY_LINE + body)
    probe = device_idle.Probe.start(PY)
    try:
        t0 = time.monotonic()
        with pytest.raises(device_idle.ProbeError, match=says):
            probe.drain(0.1)
        assert time.monotonic() - t0 < 3.0
    finally:
        probe.close()
    assert probe.proc.poll() is not None


# ------------------------------------------------------------------ served_model._gpu_probe


def _ctx(python: str) -> SimpleNamespace:
    logged: list[str] = []
    return SimpleNamespace(ws=SimpleNamespace(python=python), log=logged.append, logged=logged)


@pytest.mark.parametrize("python", ["missing", "/bin/false"], ids=["no-interpreter", "exits"])
def test_a_probe_that_cannot_start_is_the_harness_failure(tmp_path, python):
    ctx = _ctx(str(tmp_path / "no-such-python") if python == "missing" else python)
    with pytest.raises(SideFailed) as err:
        _gpu_probe(ctx)
    failure = err.value.failure
    assert failure.side is Side.HARNESS and failure.stage == "gpu-probe"
    assert "GPU idle probe" in failure.message
    assert ctx.logged == []


def test_gpu_probe_starts_the_probe_with_the_trusted_interpreter_and_logs_it(tmp_path, monkeypatch):
    device = device_double(tmp_path, monkeypatch)
    monkeypatch.setenv(DEVICE_ENV, str(device))
    ctx = _ctx(PY)
    probe = _gpu_probe(ctx)
    try:
        assert probe.proc.args[:2] == [PY, "-I"] and probe.proc.args[2] == str(device_idle.PROBE)
        assert probe.drain(1.0).idle
        assert len(ctx.logged) == 1 and "GPU idle probe ready" in ctx.logged[0]
        assert "15 µs" in ctx.logged[0]  # the double's idle round trip
    finally:
        probe.close()
