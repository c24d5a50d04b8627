"""Red team of the two-part clock (#36 part 4), by a helper playing a PR that wants a speed tier
without real work. What it tried that did not work is in docs/benchmarks.md (#36 part 4). Of the two holes it
found, the CPU after a prefill's answer is now on the prefill's CPU clock (tested below), and the GPU's queued
work is now closed by the GPU idle probe (#36 part 5, `device_idle`; tested below on a device double).

The freezer (cgroup or SIGSTOP) stops the engine's *host* processes; the CPU meter and the byte count of
its stdout see only them. On a GPU, work the engine queued before it was frozen keeps running on the
device while the other side is timed. The two-part request made this cheaper than ever: the prefill's
answer carries no token, so it needs no host sync, and an engine can answer `done` with its prefill (or
any amount of other work) still queued on the device. Where the PR's prefill is answered just before
main's continuation is sent (main first in the pair: prefills main, PR; continuations main, PR), that
queued work ran during main's timed decode and slowed it: the PR read faster by main reading slower.

The hole is closed by the idle probe: after every freeze the harness asks a trusted probe process how long
the device stays busy, the frozen engine's request ends when the device has run what it left queued
(`Timed.device_idle_ns`), and an engine that keeps the device busy past `DRAIN_LIMIT_S` fails (stage
'frozen'). This box has no GPU, so the device is the double of test_device_idle.py: a file holding until
when queued work runs, which stand-in engines write and the stand-in probe drains with the real
`gpu_probe.drain`.

The helper also wrote the same attack against two real CUDA engines (a prefill answered with
`torch.cuda._sleep` still queued). It is not kept: it has never run (the session's device time was spent),
so its threshold was a guess.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from evalbot.evaluate import ab_samples, cpumeter, device_idle, sandbox, schedule, served
from evalbot.model import Side
from tests.evalbot.test_device_idle import MS, GpuPair, prefill_s

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------ the GPU's queued work, on a device double


def test_without_the_probe_main_pays_for_the_prs_queued_prefill(tmp_path, monkeypatch):
    """The hole as it was, on the device double (test_device_idle.py): the PR's engine answers its prefill
    with 300 ms of work still queued on the device and is frozen; with no probe, nothing waits for the
    device, so main's continuation, timed next, runs behind that work: main reads slower, the PR faster."""
    pair = GpuPair(tmp_path, monkeypatch, {"QUEUE_PREFILL_MS": "300"})
    base, head = pair.run(probe=False)
    assert pair.drains == []
    assert prefill_s(head) < 0.25  # the PR's prefill: only its answer, not its queued work
    assert base.decode_s >= 0.25  # main's decode: the PR's queued work


def test_a_gpu_pair_charges_the_prs_queued_prefill_work_to_its_prefill(tmp_path, monkeypatch):
    """The same attack with the idle probe: after freezing the PR's engine the harness waits for the device
    to run what it left queued, and the PR's prefill ends there. Main's decode runs on an idle device."""
    pair = GpuPair(tmp_path, monkeypatch, {"QUEUE_PREFILL_MS": "300"})
    base, head = pair.run()
    pr_prefill = pair.timed[1]
    assert pr_prefill.request["op"] == "prefill"
    assert pr_prefill.device_idle_ns >= pr_prefill.done_ns + 290 * MS
    assert prefill_s(head) >= 0.3
    assert prefill_s(head) == pytest.approx(pr_prefill.answer_s)
    assert base.decode_s < 0.25 and pair.timed[2].device_idle_ns == 0
    assert prefill_s(base) < 0.25 and pair.timed[0].device_idle_ns == 0


def test_a_gpu_pair_fails_a_side_that_keeps_the_device_busy_past_the_limit(tmp_path, monkeypatch):
    """Queued work past DRAIN_LIMIT_S (3 s here) is no honest trailing step: the PR's side fails, stage
    'frozen', at the freeze after its prefill, before main is timed next to it."""
    pair = GpuPair(tmp_path, monkeypatch, {"QUEUE_PREFILL_MS": "3000"})
    t0 = time.monotonic()
    with pytest.raises(ab_samples.SideError) as err:
        pair.run()
    assert err.value.side is Side.HEAD and err.value.stage == "frozen"
    assert "stayed busy" in str(err.value)
    assert [d.idle for d in pair.drains][-1] is False
    assert len(pair.timed) == 1  # main's prefill only: main's continuation was never sent
    assert time.monotonic() - t0 < device_idle.DRAIN_LIMIT_S + 2.0


# ------------------------------------------------------------------ work after the prefill's answer

READY = """
import json, sys, time
def send(o):
    sys.stdout.write(json.dumps(o) + "\\n"); sys.stdout.flush()
send({"event": "ready", "protocol": "evalbot.serve/1", "config": {"vocab_size": 100},
      "ops": ["generate", "prefill"]})
"""

AFTER = (
    READY
    + """
after = 0.0
for line in sys.stdin:
    req = json.loads(line)
    if req.get("op") == "shutdown":
        break
    rid = req["id"]
    if req["op"] == "prefill":
        send({"id": rid, "event": "done", "n": len(req["prompt_ids"])})  # answered, the work not done
        t0, last = time.thread_time(), time.monotonic()
        while True:  # the prefill's work goes on until the harness freezes it (a gap in the wall clock)
            now = time.monotonic()
            if now - last > 0.05:
                break
            last, after = now, time.thread_time() - t0
        continue
    n = req["max_new"]
    send({"id": rid, "tok": 1})
    send({"id": rid, "toks": [2] * (n - 1)})
    send({"id": rid, "event": "done", "n": n, "after_ms": after * 1e3})
"""
)


@pytest.mark.timing
def test_work_done_after_the_prefill_answer_and_before_the_freeze_is_on_the_prefill_cpu_clock(tmp_path):
    """A two-part prefill is answered by its done line, and the engine is frozen only once the harness has
    read that line: whatever it computes in between (the prefill's remaining work, any precompute that
    needs no continuation token) was on no clock, 2-7 ms a request on the 2-core VM (SIGSTOP mode). The
    prefill's CPU clock now ends at the freeze that follows it, so that work is on the guarded prefill:
    the harness's reading covers what the engine itself counted after its answer."""
    meter = cpumeter.make_meter("after-test")
    if not isinstance(meter, cpumeter.CgroupMeter):
        meter.close()
        pytest.skip("needs the cgroup meter: a few ms of CPU are below /proc's 10 ms ticks")
    env = {"PATH": os.environ["PATH"], "OMP_NUM_THREADS": "1"}
    path = tmp_path / "pr.py"
    path.write_text(textwrap.dedent(AFTER))
    spec = sandbox.SandboxSpec(
        ro_binds=(), scratch=tmp_path, workdir=tmp_path, env=env,
        limits=sandbox.Limits(max_output_bytes=1 << 20, timeout_s=60),
    )  # fmt: skip
    p = served.ServedProcess.start("pr", spec, [PY, str(path)], no_sandbox=True, meter=meter)
    try:
        p.wait_ready(10)
        p.freeze()
        seen = []
        for _ in range(5):
            pre = schedule.run_alone(p, [], lambda: p.request({"op": "prefill", "prompt_ids": [1, 2, 3]}, 10))
            time.sleep(0.2)  # the other side's prefill, with this one frozen
            body = {"op": "generate", "continue": True, "prompt_ids": [7], "max_new": 4, "stream": "ends"}
            t = schedule.run_alone(p, [], lambda body=body: p.request(body, 10))
            assert pre.answer_cpu_s is not None
            seen.append((pre.answer_cpu_s * 1e3, t.summary["after_ms"]))
        print("prefill CPU clock ms, the engine's own CPU ms after its answer:", seen)
        assert any(after > 0.5 for _, after in seen), f"the engine worked after its answer: {seen}"
        assert all(clock >= after - 0.05 for clock, after in seen), seen
    finally:
        p.close()
